//! Container logs as the kubelet serves them (`/containerLogs`): the query
//! ([`PodLogOptions`](https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#get-read-log-of-the-specified-pod)
//! names and validation) and a reader of the CRI log files runtimes write
//! (`<RFC 3339 time> <stdout|stderr> <P|F> <text>` per line; the kubelet's
//! `pkg/kubelet/kuberuntime/logs`).
//!
//! * `tailLines` finds its start by reading the file backwards from its end in blocks, so the
//!   cost does not depend on the file's size;
//! * `sinceSeconds`/`sinceTime` skip lines older than the time; `timestamps` prefixes each line
//!   with its time (nine fraction digits); `limitBytes` counts what is written, prefixes
//!   included, and cuts the last line;
//! * `follow` waits at the end of the file for more, reopens the path when it is replaced
//!   (rotation), and ends once the container is no longer running (after a last read) or the
//!   client goes away. The file is polled ([`FOLLOW_POLL`]) rather than watched, so that
//!   hundreds of followers need no inotify instances.
//!
//! Only CRI-format lines are understood; others are skipped (logged at debug level).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use jiff::Timestamp;
use kubelet_api::cri_log::parse_record;
use tokio::sync::mpsc;

/// How often a follower looks for new data at the end of the file.
pub const FOLLOW_POLL: Duration = Duration::from_millis(200);
/// How often a follower asks whether the container still runs (the kubelet's
/// `logForceCheckPeriod`).
pub const FOLLOW_STATUS_CHECK: Duration = Duration::from_secs(1);
/// Most file bytes read per batch (a batch is one chunk of the response at most).
const BATCH: usize = 128 * 1024;

/// The options of a `/containerLogs` request (`PodLogOptions`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogOptions {
    /// `follow`.
    pub follow: bool,
    /// `previous`: the last terminated instance of the container.
    pub previous: bool,
    /// `timestamps`.
    pub timestamps: bool,
    /// `sinceSeconds`.
    pub since_seconds: Option<i64>,
    /// `sinceTime` (RFC 3339).
    pub since_time: Option<Timestamp>,
    /// `tailLines` (also the legacy `tail`; `tail=all` for every line).
    pub tail_lines: Option<i64>,
    /// `limitBytes`.
    pub limit_bytes: Option<i64>,
}

/// A `/containerLogs` query the kubelet would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// A value does not parse (400, the kubelet's "Unable to decode query.").
    #[error("Unable to decode query: {0}")]
    Decode(String),
    /// Values parse but are not valid together (422, the kubelet's "Invalid request."), with
    /// the API's field errors.
    #[error("Invalid request: {}", .0.join(", "))]
    Invalid(Vec<String>),
}

/// Decode `%XX` and `+` in a query component.
pub(crate) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The query's parameters in order, decoded.
pub(crate) fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
        .collect()
}

fn first<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// A boolean as the API's query decoder reads one: `0` and `false` (any case) are false,
/// anything else (the empty value too) is true.
fn query_bool(pairs: &[(String, String)], key: &str) -> bool {
    first(pairs, key).is_some_and(|v| v != "0" && !v.eq_ignore_ascii_case("false"))
}

fn query_int(pairs: &[(String, String)], key: &str) -> Result<Option<i64>, QueryError> {
    first(pairs, key)
        .map(|v| {
            v.parse::<i64>()
                .map_err(|_| QueryError::Decode(format!("{key}: {v:?} is not an integer")))
        })
        .transpose()
}

impl LogOptions {
    /// Parse and validate a `/containerLogs` query string (without the `?`).
    pub fn from_query(query: &str) -> Result<Self, QueryError> {
        let mut pairs = query_pairs(query);
        // The kubelet's backward compatibility: `tail` is `tailLines`, `tail=all` is none.
        if let Some(tail) = first(&pairs, "tail").map(str::to_string) {
            pairs.retain(|(k, _)| k != "tailLines");
            if tail != "all" {
                pairs.push(("tailLines".into(), tail));
            }
        }
        let since_time = match first(&pairs, "sinceTime") {
            None | Some("") | Some("null") => None,
            Some(v) => Some(v.parse::<Timestamp>().map_err(|_| {
                QueryError::Decode(format!("sinceTime: {v:?} is not an RFC 3339 time"))
            })?),
        };
        let options = Self {
            follow: query_bool(&pairs, "follow"),
            previous: query_bool(&pairs, "previous"),
            timestamps: query_bool(&pairs, "timestamps"),
            since_seconds: query_int(&pairs, "sinceSeconds")?,
            since_time,
            tail_lines: query_int(&pairs, "tailLines")?,
            limit_bytes: query_int(&pairs, "limitBytes")?,
        };
        options.validate()?;
        Ok(options)
    }

    /// The API's `ValidatePodLogOptions`.
    pub fn validate(&self) -> Result<(), QueryError> {
        let mut errs = Vec::new();
        if let Some(n) = self.tail_lines
            && n < 0
        {
            errs.push(format!(
                "tailLines: Invalid value: {n}: must be greater than or equal to 0"
            ));
        }
        if let Some(n) = self.limit_bytes
            && n < 1
        {
            errs.push(format!(
                "limitBytes: Invalid value: {n}: must be greater than 0"
            ));
        }
        match (self.since_seconds, self.since_time) {
            (Some(_), Some(_)) => errs.push(
                "Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified"
                    .to_string(),
            ),
            (Some(n), None) if n < 1 => errs.push(format!(
                "sinceSeconds: Invalid value: {n}: must be greater than 0"
            )),
            _ => {}
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(QueryError::Invalid(errs))
        }
    }

    /// The earliest time of a line to send, from `sinceSeconds` (relative to `now`) or
    /// `sinceTime`.
    pub fn since(&self, now: Timestamp) -> Option<Timestamp> {
        if let Some(t) = self.since_time {
            return Some(t);
        }
        let secs = self.since_seconds?;
        now.checked_sub(jiff::SignedDuration::from_secs(secs)).ok()
    }
}

/// The start of the last `n` lines of `file` (of length `len`), reading backwards in blocks.
pub fn tail_start(file: &mut File, len: u64, n: u64) -> std::io::Result<u64> {
    tail_lines(file, len, n).map(|(start, _)| start)
}

/// [`tail_start`], and how many lines start there (fewer than `n` when the file has fewer).
fn tail_lines(file: &mut File, len: u64, n: u64) -> std::io::Result<(u64, u64)> {
    if n == 0 {
        return Ok((len, 0));
    }
    const BLOCK: u64 = 4096;
    let mut end = len;
    let mut buf = vec![0u8; BLOCK as usize];
    let mut seen = 0u64;
    // A newline ending the file ends the last line; it does not start one.
    let mut skip_last = true;
    let mut any = false;
    while end > 0 {
        let start = end.saturating_sub(BLOCK);
        let chunk = &mut buf[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(chunk)?;
        for i in (0..chunk.len()).rev() {
            any = true;
            if chunk[i] != b'\n' {
                skip_last = false;
                continue;
            }
            if skip_last && start + i as u64 == len - 1 {
                skip_last = false;
                continue;
            }
            seen += 1;
            if seen == n {
                return Ok((start + i as u64 + 1, seen));
            }
        }
        end = start;
    }
    // The first line of the file has no newline before it.
    Ok((0, if any { seen + 1 } else { 0 }))
}

/// The newest rotated file of `log` still uncompressed (`<log>.<timestamp>`), the one a log
/// rotator left for readers to finish.
fn newest_rotated(log: &Path) -> Option<PathBuf> {
    let dir = log.parent()?;
    let prefix = format!("{}.", log.file_name()?.to_str()?);
    let mut rotated: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name().to_str().is_some_and(|n| {
                n.starts_with(&prefix) && !n.ends_with(".gz") && !n.ends_with(".tmp")
            })
        })
        .map(|e| e.path())
        .collect();
    kubelet_api::sort::by(&mut rotated, Ord::cmp);
    rotated.pop()
}

/// Format a time as the kubelet's `RFC3339NanoFixed` (nine fraction digits, UTC).
pub fn format_fixed(ts: Timestamp) -> String {
    let secs = ts.strftime("%Y-%m-%dT%H:%M:%S");
    format!("{secs}.{:09}Z", ts.subsec_nanosecond())
}

/// What a reader does with each line.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadOptions {
    /// Skip lines older than this.
    pub since: Option<Timestamp>,
    /// Prefix lines with their time.
    pub timestamps: bool,
    /// Stop after this many bytes written.
    pub limit_bytes: Option<u64>,
    /// Keep reading past the end (an incomplete last line waits for its end).
    pub follow: bool,
}

/// A position in a container's log file and what has been written from it.
#[derive(Debug)]
pub struct LogCursor {
    path: PathBuf,
    file: File,
    ino: u64,
    pos: u64,
    pending: Vec<u8>,
    options: ReadOptions,
    written: u64,
    done: bool,
    /// Reading the newest rotated file first (`tailLines` reaching past the current file):
    /// the current file follows at its end.
    rotated_first: bool,
}

fn inode(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.ino())
}

impl LogCursor {
    /// Open `path` (symlinks resolved) at the start of its last `tail` lines, or its start.
    pub fn open(path: &Path, tail: Option<u64>, options: ReadOptions) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let path = std::fs::canonicalize(path)?;
        let mut file = File::open(&path)?;
        let meta = file.metadata()?;
        let mut ino = meta.ino();
        let mut rotated_first = false;
        let pos = match tail {
            Some(n) => {
                let (mut pos, seen) = tail_lines(&mut file, meta.len(), n)?;
                // Fewer lines than asked for: the rest from the end of the newest rotated
                // file, so that `tailLines` spans a rotation.
                if seen < n
                    && let Some(prev) = newest_rotated(&path)
                    && let Ok(mut prev_file) = File::open(&prev)
                    && let Ok(prev_meta) = prev_file.metadata()
                {
                    pos = tail_start(&mut prev_file, prev_meta.len(), n - seen)?;
                    file = prev_file;
                    ino = prev_meta.ino();
                    rotated_first = true;
                }
                pos
            }
            None => 0,
        };
        file.seek(SeekFrom::Start(pos))?;
        Ok(Self {
            path,
            file,
            ino,
            pos,
            pending: Vec::new(),
            options,
            written: 0,
            done: options.limit_bytes == Some(0),
            rotated_first,
        })
    }

    /// Whether `limitBytes` has been reached.
    pub fn done(&self) -> bool {
        self.done
    }

    /// Whether the file holds bytes past the cursor.
    pub fn has_more(&self) -> bool {
        self.file.metadata().is_ok_and(|m| m.len() > self.pos)
    }

    /// Whether the path now names another file (rotated), or the file shrank (truncated).
    pub fn replaced(&self) -> bool {
        !self.rotated_first && inode(&self.path).is_some_and(|i| i != self.ino)
            || self.file.metadata().is_ok_and(|m| m.len() < self.pos)
    }

    /// Continue from the start of the file now at the path.
    pub fn reopen(&mut self) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let file = File::open(&self.path)?;
        self.ino = file.metadata()?.ino();
        self.file = file;
        self.pos = 0;
        self.pending.clear();
        self.rotated_first = false;
        Ok(())
    }

    /// Read up to one batch and return what to send; `true` when the end of the file was
    /// reached. Without `follow`, an incomplete last line is sent at the end; with it, it
    /// waits for its end unless `flush` is set.
    pub fn read_batch(&mut self, flush: bool) -> std::io::Result<(Vec<u8>, bool)> {
        if self.done {
            return Ok((Vec::new(), true));
        }
        // The read buffer lives only for this batch: an idle follower holds no more than its
        // incomplete last line.
        let mut buf = vec![0u8; BATCH];
        let n = loop {
            match self.file.read(&mut buf) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        };
        self.pos += n as u64;
        let eof = n == 0;
        let data = &buf[..n];
        let mut out = Vec::with_capacity(n);
        let mut start = 0;
        if !self.pending.is_empty() {
            match memchr::memchr(b'\n', data) {
                Some(nl) => {
                    let mut line = std::mem::take(&mut self.pending);
                    line.extend_from_slice(&data[..=nl]);
                    self.emit(&line, &mut out);
                    start = nl + 1;
                }
                None => {
                    self.pending.extend_from_slice(data);
                    start = n;
                }
            }
        }
        while !self.done {
            let Some(nl) = memchr::memchr(b'\n', &data[start..]) else {
                break;
            };
            self.emit(&data[start..start + nl + 1], &mut out);
            start += nl + 1;
        }
        if !self.done && start < n {
            self.pending.extend_from_slice(&data[start..]);
        }
        if eof && !self.done && !self.pending.is_empty() && (flush || !self.options.follow) {
            let line = std::mem::take(&mut self.pending);
            self.emit(&line, &mut out);
        }
        if eof && !self.done && self.rotated_first {
            // The rotated file is done: its last line is complete, and the current one follows.
            if !self.pending.is_empty() {
                let line = std::mem::take(&mut self.pending);
                self.emit(&line, &mut out);
            }
            self.reopen()?;
            return Ok((out, false));
        }
        if self.pending.is_empty() {
            self.pending = Vec::new();
        }
        Ok((out, eof || self.done))
    }

    fn emit(&mut self, line: &[u8], out: &mut Vec<u8>) {
        let Some(parsed) = parse_record(line) else {
            tracing::debug!(path = %self.path.display(), "skipping a log line that is not in the CRI format");
            return;
        };
        let needs_time = self.options.since.is_some() || self.options.timestamps;
        let ts = if needs_time {
            match parsed.time() {
                Some(ts) => Some(ts),
                None => {
                    tracing::debug!(path = %self.path.display(), "skipping a log line with an unreadable time");
                    return;
                }
            }
        } else {
            None
        };
        if let (Some(since), Some(ts)) = (self.options.since, ts)
            && ts < since
        {
            return;
        }
        let mut write = |bytes: &[u8], out: &mut Vec<u8>| -> bool {
            match self.options.limit_bytes {
                Some(limit) => {
                    let room = limit.saturating_sub(self.written) as usize;
                    let take = room.min(bytes.len());
                    out.extend_from_slice(&bytes[..take]);
                    self.written += take as u64;
                    if take < bytes.len() || self.written >= limit {
                        self.done = true;
                        return false;
                    }
                    true
                }
                None => {
                    out.extend_from_slice(bytes);
                    self.written += bytes.len() as u64;
                    true
                }
            }
        };
        if self.options.timestamps
            && let Some(ts) = ts
        {
            let prefix = format!("{} ", format_fixed(ts));
            if !write(prefix.as_bytes(), out) {
                return;
            }
        }
        // A full record's content ends with its newline; a partial one's line goes on.
        let content = if parsed.partial {
            parsed.content.strip_suffix(b"\n").unwrap_or(parsed.content)
        } else {
            parsed.content
        };
        write(content, out);
    }
}

/// Send a log to `tx` as chunks: the whole file, or with `follow` until `running` says the
/// container stopped (then what it wrote last) or the receiver is dropped.
pub async fn stream_log<F, Fut>(mut cursor: LogCursor, tx: mpsc::Sender<Bytes>, running: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let follow = cursor.options.follow;
    let mut last_check: Option<tokio::time::Instant> = None;
    let mut draining = false;
    loop {
        let read = tokio::task::spawn_blocking(move || {
            let r = cursor.read_batch(draining);
            (cursor, r)
        })
        .await;
        let (c, result) = match read {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %kubelet_api::chain(&e), "a log reader task failed");
                return;
            }
        };
        cursor = c;
        let eof = match result {
            Ok((out, eof)) => {
                if !out.is_empty() && tx.send(Bytes::from(out)).await.is_err() {
                    return;
                }
                eof
            }
            Err(e) => {
                tracing::warn!(path = %cursor.path.display(), error = %kubelet_api::chain(&e), "reading a container log failed");
                return;
            }
        };
        if cursor.done() || (eof && (!follow || draining)) {
            return;
        }
        if !eof {
            continue;
        }
        // At the end of a followed file: wait for more, a rotation, the container's exit or
        // the client leaving.
        loop {
            let due = last_check.is_none_or(|t| t.elapsed() >= FOLLOW_STATUS_CHECK);
            if due {
                last_check = Some(tokio::time::Instant::now());
                if !running().await {
                    draining = true;
                    break;
                }
            }
            // What the old file got before the rotation is read before the new file: no line
            // is lost or sent twice across a rotation.
            if cursor.has_more() {
                break;
            }
            if cursor.replaced() {
                if let Err(e) = cursor.reopen() {
                    tracing::debug!(path = %cursor.path.display(), error = %kubelet_api::chain(&e), "reopening a rotated log failed; retrying");
                } else {
                    break;
                }
            }
            tokio::select! {
                _ = tx.closed() => return,
                _ = tokio::time::sleep(FOLLOW_POLL) => {}
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::Write;

    fn opts(q: &str) -> Result<LogOptions, QueryError> {
        LogOptions::from_query(q)
    }

    #[test]
    fn queries_decode_as_the_api_decodes_them() {
        let o = opts("follow=true&previous=1&timestamps&tailLines=10&limitBytes=5").unwrap();
        assert!(o.follow && o.previous && o.timestamps);
        assert_eq!(o.tail_lines, Some(10));
        assert_eq!(o.limit_bytes, Some(5));
        let o = opts("follow=false&previous=0&timestamps=FALSE").unwrap();
        assert!(!o.follow && !o.previous && !o.timestamps);
        assert_eq!(opts("tail=7").unwrap().tail_lines, Some(7));
        assert_eq!(opts("tail=all&tailLines=3").unwrap().tail_lines, None);
        let o = opts("sinceTime=2024-01-02T03%3A04%3A05Z").unwrap();
        assert_eq!(
            o.since_time.unwrap(),
            "2024-01-02T03:04:05Z".parse::<Timestamp>().unwrap()
        );
    }

    #[test]
    fn bad_values_are_the_apis_errors_naming_the_parameter() {
        assert_eq!(
            opts("tailLines=-1").unwrap_err(),
            QueryError::Invalid(vec![
                "tailLines: Invalid value: -1: must be greater than or equal to 0".into()
            ])
        );
        assert_eq!(
            opts("limitBytes=0").unwrap_err(),
            QueryError::Invalid(vec![
                "limitBytes: Invalid value: 0: must be greater than 0".into()
            ])
        );
        assert_eq!(
            opts("sinceSeconds=0").unwrap_err(),
            QueryError::Invalid(vec![
                "sinceSeconds: Invalid value: 0: must be greater than 0".into()
            ])
        );
        let both = opts("sinceSeconds=5&sinceTime=2024-01-02T03:04:05Z").unwrap_err();
        assert!(
            both.to_string()
                .contains("at most one of `sinceTime` or `sinceSeconds`")
        );
        let garbage = opts("sinceTime=garbage").unwrap_err();
        assert!(matches!(garbage, QueryError::Decode(ref m) if m.contains("sinceTime")));
        let garbage = opts("tailLines=ten").unwrap_err();
        assert!(matches!(garbage, QueryError::Decode(ref m) if m.contains("tailLines")));
    }

    fn log_file(lines: &[&str]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        let mut f = File::create(&path).unwrap();
        for l in lines {
            f.write_all(l.as_bytes()).unwrap();
        }
        (dir, path)
    }

    fn read_all(path: &Path, tail: Option<u64>, options: ReadOptions) -> String {
        let mut c = LogCursor::open(path, tail, options).unwrap();
        let mut all = Vec::new();
        loop {
            let (out, eof) = c.read_batch(false).unwrap();
            all.extend(out);
            if eof {
                break;
            }
        }
        String::from_utf8(all).unwrap()
    }

    const LINES: &[&str] = &[
        "2024-01-01T00:00:01.000000001Z stdout F one\n",
        "2024-01-01T00:00:02.5Z stderr F two\n",
        "2024-01-01T00:00:03Z stdout P thr\n",
        "2024-01-01T00:00:03.1Z stdout F ee\n",
        "not a cri line\n",
        "2024-01-01T00:00:04Z stdout F four\n",
    ];

    #[test]
    fn cri_lines_are_joined_filtered_and_stamped() {
        let (_d, path) = log_file(LINES);
        assert_eq!(
            read_all(&path, None, ReadOptions::default()),
            "one\ntwo\nthree\nfour\n"
        );
        let since = ReadOptions {
            since: Some("2024-01-01T00:00:03Z".parse().unwrap()),
            ..Default::default()
        };
        assert_eq!(read_all(&path, None, since), "three\nfour\n");
        let stamped = ReadOptions {
            timestamps: true,
            ..Default::default()
        };
        let out = read_all(&path, Some(3), stamped);
        assert_eq!(
            out,
            "2024-01-01T00:00:03.100000000Z ee\n2024-01-01T00:00:04.000000000Z four\n"
        );
        let limited = ReadOptions {
            limit_bytes: Some(6),
            ..Default::default()
        };
        assert_eq!(read_all(&path, None, limited), "one\ntw");
    }

    #[test]
    fn tail_counts_lines_from_the_end() {
        let (_d, path) = log_file(LINES);
        let o = ReadOptions::default();
        assert_eq!(read_all(&path, Some(1), o), "four\n");
        assert_eq!(read_all(&path, Some(3), o), "ee\nfour\n");
        assert_eq!(read_all(&path, Some(0), o), "");
        assert_eq!(read_all(&path, Some(100), o), "one\ntwo\nthree\nfour\n");
        // An unterminated last line counts as a line.
        let (_d2, path) = log_file(&[
            "2024-01-01T00:00:01Z stdout F a\n",
            "2024-01-01T00:00:02Z stdout F b",
        ]);
        assert_eq!(read_all(&path, Some(1), o), "b");
    }

    #[test]
    fn tail_lines_reach_into_the_newest_rotated_file() {
        let (dir, path) = log_file(&[
            "2024-01-01T00:00:04Z stdout F d\n",
            "2024-01-01T00:00:05Z stdout F e\n",
        ]);
        let line = |c: &str| format!("2024-01-01T00:00:01Z stdout F {c}\n");
        std::fs::write(
            dir.path().join("0.log.20240101-000000.gz"),
            line("compressed"),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("0.log.20240101-000003"),
            [line("a"), line("b"), line("c")].concat(),
        )
        .unwrap();
        let o = ReadOptions::default();
        assert_eq!(read_all(&path, Some(4), o), "b\nc\nd\ne\n");
        assert_eq!(read_all(&path, Some(2), o), "d\ne\n");
        assert_eq!(read_all(&path, Some(100), o), "a\nb\nc\nd\ne\n");
        assert_eq!(read_all(&path, None, o), "d\ne\n");
    }

    #[test]
    fn tail_of_a_large_file_spans_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.log");
        let mut f = File::create(&path).unwrap();
        for i in 0..20_000 {
            writeln!(f, "2024-01-01T00:00:00Z stdout F line {i}").unwrap();
        }
        drop(f);
        let out = read_all(&path, Some(3), ReadOptions::default());
        assert_eq!(out, "line 19997\nline 19998\nline 19999\n");
    }

    #[tokio::test]
    async fn follow_sends_new_lines_survives_rotation_and_ends_when_the_container_stops() {
        let (dir, path) = log_file(&["2024-01-01T00:00:01Z stdout F first\n"]);
        let cursor = LogCursor::open(
            &path,
            None,
            ReadOptions {
                follow: true,
                ..Default::default()
            },
        )
        .unwrap();
        let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (tx, mut rx) = mpsc::channel(4);
        let r = running.clone();
        let task = tokio::spawn(stream_log(cursor, tx, move || {
            let r = r.clone();
            async move { r.load(std::sync::atomic::Ordering::SeqCst) }
        }));
        assert_eq!(rx.recv().await.unwrap(), "first\n");
        {
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap();
            // A partial line is held back until its end arrives.
            f.write_all(b"2024-01-01T00:00:02Z stdout F sec").unwrap();
            tokio::time::sleep(FOLLOW_POLL * 2).await;
            f.write_all(b"ond\n").unwrap();
        }
        assert_eq!(rx.recv().await.unwrap(), "second\n");
        // Rotation: the path now names a new file.
        std::fs::rename(&path, dir.path().join("0.log.1")).unwrap();
        std::fs::write(&path, "2024-01-01T00:00:03Z stdout F third\n").unwrap();
        assert_eq!(rx.recv().await.unwrap(), "third\n");
        // The container stops after writing one more line: it is sent, then the stream ends.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"2024-01-01T00:00:04Z stdout F last")
            .unwrap();
        running.store(false, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(rx.recv().await.unwrap(), "last");
        assert!(rx.recv().await.is_none());
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_follower_whose_client_left_stops() {
        let (_dir, path) = log_file(&[]);
        let cursor = LogCursor::open(
            &path,
            None,
            ReadOptions {
                follow: true,
                ..Default::default()
            },
        )
        .unwrap();
        let (tx, rx) = mpsc::channel(1);
        let task = tokio::spawn(stream_log(cursor, tx, || async { true }));
        tokio::time::sleep(FOLLOW_POLL).await;
        drop(rx);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the follower ends")
            .unwrap();
    }
}
