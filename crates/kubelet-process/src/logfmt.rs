//! The CRI container log format: `<RFC3339Nano timestamp> <stream> <F|P> <content>\n`, as
//! containerd writes it and the kubelet's `kubectl logs` reader parses it.

use std::io::{BufRead, Write};

use jiff::Timestamp;
use parking_lot::Mutex;

/// Longest content written as one log line; longer lines are split into `P` (partial) records
/// followed by one `F` (full) record, as containerd does.
pub(crate) const MAX_LINE: usize = 16 * 1024;

/// Which output stream a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Format one CRI log record. `content` excludes the newline.
pub(crate) fn format_line(ts: Timestamp, stream: Stream, partial: bool, content: &[u8]) -> Vec<u8> {
    let ts = ts.to_string();
    let mut out = Vec::with_capacity(ts.len() + content.len() + 12);
    out.extend_from_slice(ts.as_bytes());
    out.push(b' ');
    out.extend_from_slice(stream.as_str().as_bytes());
    out.extend_from_slice(if partial { b" P " } else { b" F " });
    out.extend_from_slice(content);
    out.push(b'\n');
    out
}

/// Copy `reader` to `sink` line by line in CRI format until EOF. A trailing line without a
/// newline is written as a full (`F`) record.
pub(crate) fn pump<R: BufRead, W: Write>(mut reader: R, stream: Stream, sink: &Mutex<W>) {
    let mut line: Vec<u8> = Vec::new();
    let emit = |line: &mut Vec<u8>, partial: bool| {
        let rec = format_line(Timestamp::now(), stream, partial, line);
        line.clear();
        let mut w = sink.lock();
        // A failing log write (disk full) must not kill the container: drop the line.
        let _ = w.write_all(&rec).and_then(|()| w.flush());
    };
    loop {
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if buf.is_empty() {
            if !line.is_empty() {
                emit(&mut line, false);
            }
            break;
        }
        let room = MAX_LINE - line.len();
        let window = &buf[..buf.len().min(room)];
        if let Some(i) = window.iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&window[..i]);
            reader.consume(i + 1);
            emit(&mut line, false);
        } else {
            let n = window.len();
            line.extend_from_slice(window);
            reader.consume(n);
            if line.len() >= MAX_LINE {
                emit(&mut line, true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts() -> Timestamp {
        "2024-05-06T07:08:09.123456789Z".parse().expect("timestamp")
    }

    #[test]
    fn full_and_partial_records_follow_the_cri_format() {
        assert_eq!(
            format_line(ts(), Stream::Stdout, false, b"hello world"),
            b"2024-05-06T07:08:09.123456789Z stdout F hello world\n".to_vec()
        );
        assert_eq!(
            format_line(ts(), Stream::Stderr, true, b"part"),
            b"2024-05-06T07:08:09.123456789Z stderr P part\n".to_vec()
        );
    }

    fn records(out: &[u8]) -> Vec<(String, String, String)> {
        String::from_utf8_lossy(out)
            .lines()
            .map(|l| {
                let mut it = l.splitn(4, ' ');
                let t = it.next().expect("ts");
                t.parse::<Timestamp>().expect("RFC 3339 timestamp");
                (
                    it.next().expect("stream").to_string(),
                    it.next().expect("tag").to_string(),
                    it.next().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn pump_splits_lines_and_keeps_a_trailing_fragment() {
        let sink = Mutex::new(Vec::new());
        pump(&b"one\n\ntwo\nlast"[..], Stream::Stdout, &sink);
        let r = records(&sink.lock());
        let contents: Vec<&str> = r.iter().map(|(_, _, c)| c.as_str()).collect();
        assert_eq!(contents, ["one", "", "two", "last"]);
        assert!(r.iter().all(|(s, t, _)| s == "stdout" && t == "F"));
    }

    #[test]
    fn pump_marks_overlong_lines_partial() {
        let sink = Mutex::new(Vec::new());
        let mut input = vec![b'x'; MAX_LINE * 2 + 10];
        input.push(b'\n');
        pump(&input[..], Stream::Stderr, &sink);
        let r = records(&sink.lock());
        let tags: Vec<&str> = r.iter().map(|(_, t, _)| t.as_str()).collect();
        assert_eq!(tags, ["P", "P", "F"]);
        assert_eq!(r[2].2.len(), 10);
        assert_eq!(
            r.iter().map(|(_, _, c)| c.len()).sum::<usize>(),
            MAX_LINE * 2 + 10
        );
    }
}
