//! The CRI container log format, for runtimes that write container logs themselves and for
//! readers of them: one record per line,
//! `<RFC 3339 timestamp> <stdout|stderr> <F|P> <content>\n`, as containerd writes it and the
//! kubelet's `kubectl logs` reads it. A line longer than [`MAX_RECORD_CONTENT`] is split into
//! partial (`P`) records followed by one full (`F`) record.
//!
//! The engine hands a runtime the log path in
//! [`ContainerConfig::log_path`](crate::runtime::ContainerConfig::log_path) (relative to the
//! sandbox's log directory); the runtime writes the container's output there in this format.
//!
//! ```
//! use kubelet_api::cri_log::{LogStream, parse_record, write_records};
//!
//! // A runtime pumping a container's stdout into its log file:
//! let output: &[u8] = b"hello\nworld";
//! let mut file = Vec::new();
//! write_records(output, LogStream::Stdout, |record| file.extend_from_slice(record));
//!
//! // A reader (what `kubectl logs` shows):
//! let text = String::from_utf8(file).unwrap();
//! let contents: Vec<&[u8]> = text
//!     .lines()
//!     .map(|line| parse_record(line.as_bytes()).unwrap().content)
//!     .collect();
//! assert_eq!(contents, [&b"hello"[..], &b"world"[..]]);
//! assert!(text.lines().all(|l| l.contains(" stdout F ")));
//! ```

use std::io::BufRead;

use jiff::Timestamp;

/// Longest content written as one record; longer lines are split into partial records, as
/// containerd does (16 KiB).
pub const MAX_RECORD_CONTENT: usize = 16 * 1024;

/// Which output stream a record came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogStream {
    /// The container's standard output.
    Stdout,
    /// The container's standard error.
    Stderr,
}

impl LogStream {
    /// `stdout` or `stderr`, as written in a record.
    pub fn as_str(self) -> &'static str {
        match self {
            LogStream::Stdout => "stdout",
            LogStream::Stderr => "stderr",
        }
    }
}

/// Formats one record at `ts`. `content` excludes the newline; `partial` marks a piece of a
/// longer line (`P`), else the line ends here (`F`).
pub fn format_record(ts: Timestamp, stream: LogStream, partial: bool, content: &[u8]) -> Vec<u8> {
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

/// Reads `reader` to its end and hands each record (newline included) to `write`, stamped
/// with the time it was read: lines become full records, a line longer than
/// [`MAX_RECORD_CONTENT`] becomes partial records and a full one, and a trailing fragment
/// without a newline becomes a full record. A read error ends the copy as the end does.
pub fn write_records<R: BufRead>(mut reader: R, stream: LogStream, mut write: impl FnMut(&[u8])) {
    let mut line: Vec<u8> = Vec::new();
    let mut emit = |line: &mut Vec<u8>, partial: bool| {
        write(&format_record(Timestamp::now(), stream, partial, line));
        line.clear();
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
        let room = MAX_RECORD_CONTENT - line.len();
        let window = &buf[..buf.len().min(room)];
        if let Some(i) = window.iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&window[..i]);
            reader.consume(i + 1);
            emit(&mut line, false);
        } else {
            let n = window.len();
            line.extend_from_slice(window);
            reader.consume(n);
            if line.len() >= MAX_RECORD_CONTENT {
                emit(&mut line, true);
            }
        }
    }
}

/// One parsed record, borrowing the line it was parsed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogRecord<'a> {
    /// The timestamp as written (parse it with [`time`](Self::time) when needed).
    pub timestamp: &'a [u8],
    /// The stream.
    pub stream: LogStream,
    /// A piece of a longer line (`P`); else the line ends with this record (`F`).
    pub partial: bool,
    /// Everything after the tag, as given (a trailing newline stays if the caller passed one).
    pub content: &'a [u8],
}

impl LogRecord<'_> {
    /// The timestamp, if it is RFC 3339.
    pub fn time(&self) -> Option<Timestamp> {
        std::str::from_utf8(self.timestamp).ok()?.parse().ok()
    }
}

/// Parses one record; `None` when the line is not in the format (no stream or tag, or a
/// stream other than `stdout`/`stderr`). Tags may carry `:`-separated extras after `P`/`F`,
/// as the format allows.
pub fn parse_record(line: &[u8]) -> Option<LogRecord<'_>> {
    let mut parts = line.splitn(4, |b| *b == b' ');
    let timestamp = parts.next()?;
    let stream = match parts.next()? {
        b"stdout" => LogStream::Stdout,
        b"stderr" => LogStream::Stderr,
        _ => return None,
    };
    let tag = parts.next()?;
    let content = parts.next()?;
    let partial = tag.split(|b| *b == b':').next() == Some(b"P");
    Some(LogRecord {
        timestamp,
        stream,
        partial,
        content,
    })
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
            format_record(ts(), LogStream::Stdout, false, b"hello world"),
            b"2024-05-06T07:08:09.123456789Z stdout F hello world\n".to_vec()
        );
        assert_eq!(
            format_record(ts(), LogStream::Stderr, true, b"part"),
            b"2024-05-06T07:08:09.123456789Z stderr P part\n".to_vec()
        );
    }

    fn records(out: &[u8]) -> Vec<LogRecord<'_>> {
        out.split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let r = parse_record(l).expect("a record");
                r.time().expect("RFC 3339 timestamp");
                r
            })
            .collect()
    }

    #[test]
    fn lines_become_records_and_a_trailing_fragment_is_kept() {
        let mut out = Vec::new();
        write_records(&b"one\n\ntwo\nlast"[..], LogStream::Stdout, |r| {
            out.extend_from_slice(r)
        });
        let r = records(&out);
        let contents: Vec<&[u8]> = r.iter().map(|r| r.content).collect();
        assert_eq!(contents, [&b"one"[..], b"", b"two", b"last"]);
        assert!(
            r.iter()
                .all(|r| r.stream == LogStream::Stdout && !r.partial)
        );
    }

    #[test]
    fn overlong_lines_are_split_into_partial_records() {
        let mut out = Vec::new();
        let mut input = vec![b'x'; MAX_RECORD_CONTENT * 2 + 10];
        input.push(b'\n');
        write_records(&input[..], LogStream::Stderr, |r| out.extend_from_slice(r));
        let r = records(&out);
        let partial: Vec<bool> = r.iter().map(|r| r.partial).collect();
        assert_eq!(partial, [true, true, false]);
        assert_eq!(r[2].content.len(), 10);
        assert_eq!(
            r.iter().map(|r| r.content.len()).sum::<usize>(),
            MAX_RECORD_CONTENT * 2 + 10
        );
    }

    #[test]
    fn lines_not_in_the_format_are_refused_and_extra_tags_accepted() {
        assert_eq!(parse_record(b"garbage"), None);
        assert_eq!(parse_record(b"2024-01-01T00:00:00Z stdin F x"), None);
        assert_eq!(parse_record(b"2024-01-01T00:00:00Z stdout"), None);
        let r = parse_record(b"2024-01-01T00:00:00Z stderr P:extra part\n").expect("record");
        assert!(r.partial);
        assert_eq!(r.stream, LogStream::Stderr);
        assert_eq!(r.content, b"part\n");
        let r = parse_record(b"2024-01-01T00:00:00Z stdout F ").expect("empty line");
        assert_eq!(r.content, b"");
    }
}
