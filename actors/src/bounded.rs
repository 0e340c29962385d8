//! Reads from something the daemon does not control, each with a ceiling.
//!
//! A guest's console, a container engine's answer, a tool run on a job's behalf, a log a job
//! writes to: each can be endless. A read that grows a buffer until the peer stops is a way
//! to take the daemon's memory (one endless console line grew it by 33 MB in 100 s; an engine
//! answering with an endless chunked body took it to 20 GB in 16 s). So every such read here
//! stops at a ceiling, and what it does past it (cut a line, refuse an answer, rotate a log) is
//! said where it is used.

use std::{
    fs::File,
    io::{self, Read, Write},
    path::{Path, PathBuf},
};

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt};

/// Reads the file at `path`, refusing one larger than `max` bytes.
pub fn read_file(path: impl AsRef<Path>, max: u64) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    File::open(path)?
        .take(max.saturating_add(1))
        .read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(too_large(max));
    }
    Ok(out)
}

/// Reads all of `reader`, refusing more than `max` bytes.
pub async fn read_all(mut reader: impl AsyncRead + Unpin, max: usize) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    (&mut reader)
        .take(max as u64 + 1)
        .read_to_end(&mut out)
        .await?;
    if out.len() > max {
        return Err(too_large(max as u64));
    }
    Ok(out)
}

fn too_large(max: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("more than {max} bytes: not read further"),
    )
}

/// What a process printed and how it ended, each stream cut at a ceiling.
#[derive(Debug, Clone)]
pub struct Output {
    /// How it ended.
    pub status: std::process::ExitStatus,
    /// Its standard output, at most the ceiling.
    pub stdout: Vec<u8>,
    /// Its standard error, at most the ceiling.
    pub stderr: Vec<u8>,
}

/// Runs `command` to its end and keeps at most `max` bytes of each of its output streams (the
/// rest is read and dropped, so the process is never blocked on a full pipe).
pub async fn output(command: &mut tokio::process::Command, max: usize) -> io::Result<Output> {
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let (out, err) = (child.stdout.take(), child.stderr.take());
    let (stdout, stderr, status) = tokio::join!(keep_head(out, max), keep_head(err, max), child.wait());
    Ok(Output {
        status: status?,
        stdout: stdout?,
        stderr: stderr?,
    })
}

/// The first `max` bytes of `reader`, the rest read and dropped (the writer never blocks).
pub async fn keep_head(reader: Option<impl AsyncRead + Unpin>, max: usize) -> io::Result<Vec<u8>> {
    let Some(mut reader) = reader else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    (&mut reader).take(max as u64).read_to_end(&mut out).await?;
    tokio::io::copy(&mut reader, &mut tokio::io::sink()).await?;
    Ok(out)
}

/// One line read by [`Lines`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// Its text (lossy UTF-8), at most the ceiling, without its end.
    pub text: String,
    /// Bytes of it past the ceiling, dropped.
    pub cut: u64,
}

/// Lines of a stream, each at most `max` bytes: a longer line keeps its head, and the rest up
/// to its end is read and dropped (counted in [`Line::cut`]), so memory never grows with it.
#[derive(Debug)]
pub struct Lines<R> {
    reader: R,
    max: usize,
}

impl<R: AsyncBufRead + Unpin> Lines<R> {
    /// Lines of `reader`, cut at `max` bytes.
    pub fn new(reader: R, max: usize) -> Self {
        Lines { reader, max }
    }

    /// The next line; `None` at the end of the stream.
    pub async fn next_line(&mut self) -> io::Result<Option<Line>> {
        let mut head: Vec<u8> = Vec::new();
        let mut cut = 0u64;
        let mut any = false;
        loop {
            let buf = self.reader.fill_buf().await?;
            if buf.is_empty() {
                return Ok(any.then(|| line(&head, cut)));
            }
            any = true;
            let (chunk, end) = match buf.iter().position(|b| *b == b'\n') {
                Some(i) => (&buf[..i], Some(i + 1)),
                None => (buf, None),
            };
            let room = self.max.saturating_sub(head.len());
            let kept = chunk.len().min(room);
            head.extend_from_slice(&chunk[..kept]);
            cut += (chunk.len() - kept) as u64;
            let used = end.unwrap_or(buf.len());
            self.reader.consume(used);
            if end.is_some() {
                return Ok(Some(line(&head, cut)));
            }
        }
    }
}

fn line(head: &[u8], cut: u64) -> Line {
    let text = String::from_utf8_lossy(head);
    Line {
        text: text.strip_suffix('\r').unwrap_or(&text).to_string(),
        cut,
    }
}

/// A log file that never grows past `max` bytes: when a write would pass it, the file is moved
/// to `<path>.1` (replacing an older one) and a new one begun, as the container logs rotate.
/// So a flood keeps its newest output and at most twice `max` of the disk.
#[derive(Debug)]
pub struct CappedLog {
    path: PathBuf,
    file: File,
    written: u64,
    max: u64,
}

impl CappedLog {
    /// Opens (appending to) the log at `path`, created 0600.
    pub fn open(path: &Path, max: u64) -> io::Result<CappedLog> {
        let file = crate::harden::private_file(path, true)?;
        let written = file.metadata()?.len();
        Ok(CappedLog {
            path: path.to_path_buf(),
            file,
            written,
            max,
        })
    }

    /// Appends `bytes`, rotating first when they would pass the ceiling (a single write larger
    /// than the ceiling keeps its last `max` bytes).
    pub fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        let bytes = &bytes[bytes.len().saturating_sub(self.max as usize)..];
        if self.written + bytes.len() as u64 > self.max {
            self.rotate()?;
        }
        self.file.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Appends `line` and a line end.
    pub fn line(&mut self, line: &str) -> io::Result<()> {
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.trim_end().as_bytes());
        bytes.push(b'\n');
        self.write(&bytes)
    }

    fn rotate(&mut self) -> io::Result<()> {
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        std::fs::rename(&self.path, &old)?;
        self.file = crate::harden::private_file(&self.path, true)?;
        self.written = 0;
        Ok(())
    }
}

/// Keeps the log at `path`, which another process appends to (`O_APPEND`: a runner's output),
/// near `max` bytes: when it is larger, its last `max` bytes go to `<path>.1` and it is cut to
/// nothing, the writer going on at its new end. Returns whether it was cut. What the writer
/// adds between the copy and the cut is lost; a writer that floods is bounded by what it writes
/// between two looks.
pub fn cut_log(path: &Path, max: u64) -> io::Result<bool> {
    use std::io::{Seek, SeekFrom};
    let mut file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
    let len = file.metadata()?.len();
    if len <= max {
        return Ok(false);
    }
    file.seek(SeekFrom::Start(len - max))?;
    let mut old = path.to_path_buf().into_os_string();
    old.push(".1");
    let mut kept = crate::harden::private_file(Path::new(&old), false)?;
    io::copy(&mut (&mut file).take(max), &mut kept)?;
    file.set_len(0)?;
    Ok(true)
}

/// Copies `reader` into `log` to its end, in chunks (a runner's or a guest's output).
pub async fn copy_into(mut reader: impl AsyncRead + Unpin, log: &mut CappedLog) -> io::Result<()> {
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = reader.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        log.write(&buf[..n])?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_endless_line_keeps_its_head_and_the_next_line_is_whole() {
        let mut text = vec![b'x'; 1 << 20];
        text.extend_from_slice(b"\r\nEXIT 0\nlast");
        let mut lines = Lines::new(tokio::io::BufReader::new(&text[..]), 64);
        let first = lines.next_line().await.unwrap().unwrap();
        assert_eq!(first.text.len(), 64);
        assert_eq!(first.cut, (1 << 20) - 64 + 1, "the \\r counts as cut past the head");
        assert_eq!(
            lines.next_line().await.unwrap().unwrap(),
            Line {
                text: "EXIT 0".into(),
                cut: 0
            }
        );
        assert_eq!(lines.next_line().await.unwrap().unwrap().text, "last");
        assert_eq!(lines.next_line().await.unwrap(), None);
    }

    /// A stream that never ends and has no line end: memory stays at the ceiling (the reader
    /// would spin forever; the test reads a bounded prefix of it).
    #[tokio::test]
    async fn a_line_with_no_end_grows_nothing() {
        let endless = tokio::io::repeat(b'y').take(64 << 20);
        let mut lines = Lines::new(tokio::io::BufReader::new(endless), 1024);
        let line = lines.next_line().await.unwrap().unwrap();
        assert_eq!(line.text.len(), 1024);
        assert_eq!(line.cut, (64 << 20) - 1024);
    }

    #[test]
    fn a_file_over_the_ceiling_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        std::fs::write(&path, vec![b'a'; 100]).unwrap();
        assert_eq!(read_file(&path, 100).unwrap().len(), 100);
        let err = read_file(&path, 99).unwrap_err();
        assert!(err.to_string().contains("more than 99 bytes"), "{err}");
    }

    #[tokio::test]
    async fn a_process_flooding_its_output_is_kept_to_the_ceiling_and_not_blocked() {
        let out = output(
            tokio::process::Command::new("sh").args([
                "-c",
                "head -c 5000000 /dev/zero; head -c 300000 /dev/zero >&2; exit 3",
            ]),
            1000,
        )
        .await
        .unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!((out.stdout.len(), out.stderr.len()), (1000, 1000));
    }

    #[tokio::test]
    async fn an_endless_answer_is_refused_at_the_ceiling() {
        let endless = tokio::io::repeat(b'z');
        let err = read_all(endless, 4096).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert_eq!(read_all(&b"small"[..], 4096).await.unwrap(), b"small");
    }

    #[test]
    fn a_log_another_process_appends_to_is_cut_and_its_tail_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("runner.log");
        let mut writer = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        writer.write_all(&vec![b'a'; 5000]).unwrap();
        writer.write_all(b"newest").unwrap();
        assert!(!cut_log(&path, 10_000).unwrap());
        assert!(cut_log(&path, 1000).unwrap());
        let tail = std::fs::read(tmp.path().join("runner.log.1")).unwrap();
        assert_eq!(tail.len(), 1000);
        assert!(tail.ends_with(b"newest"));
        writer.write_all(b"after").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"after", "the writer goes on at the start");
    }

    #[test]
    fn a_flooded_log_rotates_and_never_passes_twice_its_ceiling() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("vm.log");
        let mut log = CappedLog::open(&path, 1000).unwrap();
        for i in 0..500 {
            log.line(&format!("line {i:04} of the flood")).unwrap();
        }
        let now = std::fs::read_to_string(&path).unwrap();
        let old = std::fs::read_to_string(tmp.path().join("vm.log.1")).unwrap();
        assert!(now.len() <= 1000 && old.len() <= 1000, "{} {}", now.len(), old.len());
        assert!(now.ends_with("line 0499 of the flood\n"), "the newest is kept");
        log.write(&vec![b'q'; 5000]).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 1000);
    }
}
