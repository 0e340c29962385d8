//! The daemon's side of the guest agent's port (`contrib/linux-vm/ephemer-agent`, the VM's
//! init): a line protocol over the VM's serial console, which QEMU serves on a unix socket only
//! the daemon can open (its run directory is 0700). Every other line the guest prints (the
//! kernel's, the runner's) goes to the VM's log.
//!
//! The agent says `EPHEMER-AGENT READY 1` once the guest is up; the daemon answers with the
//! runner's variables and the JIT config (the payload the tart pool sends over ssh); the agent
//! says `STARTED`, then `EXIT <code>` when the runner ends, and powers the VM off.
//!
//! Everything on the port is the guest's to write, a job with root included: a line is read up
//! to [`MAX_LINE`] bytes (the rest of a longer one is dropped, never buffered) and the VM's log
//! rotates at [`crate::provision::container::LOG_CAP`], so an endless line or a flood of them
//! costs neither memory nor disk.

use std::{path::Path, time::Duration};

use tokio::{
    io::{AsyncWriteExt, BufReader},
    net::UnixStream,
};

use crate::{
    bounded::{CappedLog, Line, Lines},
    provision::ProvisionError,
};

/// The longest console line kept whole; the agent's own lines are a few bytes.
pub(super) const MAX_LINE: usize = 16 << 10;

/// The agent's hello.
pub(super) const HELLO: &str = "EPHEMER-AGENT READY 1";

/// What one line from the agent says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Said {
    /// The guest booted; the agent waits for its runner.
    Ready,
    /// The runner was started.
    Started,
    /// The runner ended with this code.
    Exit(i32),
    /// Anything else (a line the port garbled, a later agent's news): ignored.
    Other,
}

/// Reads one line of the agent.
pub(super) fn said(line: &str) -> Said {
    let line = line.trim();
    if line == HELLO {
        Said::Ready
    } else if line == "STARTED" {
        Said::Started
    } else if let Some(code) = line.strip_prefix("EXIT ") {
        code.parse().map_or(Said::Other, Said::Exit)
    } else {
        Said::Other
    }
}

/// An agent that said hello, waiting for its runner.
pub(super) struct Agent {
    lines: Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    write: tokio::net::unix::OwnedWriteHalf,
    log: CappedLog,
}

/// Keeps a line of the guest's console in the VM's log (a cut line says how much was cut).
fn keep(log: &mut CappedLog, line: &Line) {
    let _ = match line.cut {
        0 => log.line(&line.text),
        cut => log.line(&format!("{} [... {cut} more bytes of this line dropped]", line.text)),
    };
}

impl Agent {
    /// Connects to the agent's port at `socket` (QEMU makes it as it starts) and waits for the
    /// hello, for up to `timeout` from now; `alive` says whether QEMU still runs.
    pub(super) async fn hello(
        socket: &Path,
        timeout: Duration,
        alive: impl Fn() -> bool,
        mut log: CappedLog,
    ) -> Result<Agent, ProvisionError> {
        let failed = |what: String| ProvisionError::EnvironmentFailed(what);
        // Through the run directory's descriptor: the path QEMU was given is relative, and the
        // directory's own path may be longer than a socket's address can hold.
        let dir = socket.parent().unwrap_or(Path::new("."));
        let name = socket.file_name().unwrap_or_default();
        let dir_fd = std::fs::File::open(dir).map_err(|e| {
            failed(format!("cannot open the VM's run directory {}: {e}", dir.display()))
        })?;
        let short = {
            use std::os::fd::AsRawFd;
            Path::new("/proc/self/fd")
                .join(dir_fd.as_raw_fd().to_string())
                .join(name)
        };
        let wait = async {
            let stream = loop {
                if let Ok(s) = UnixStream::connect(&short).await {
                    break s;
                }
                if !alive() {
                    return Err(failed("QEMU exited before the VM's agent port opened".into()));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            let (read, write) = stream.into_split();
            let mut lines = Lines::new(BufReader::new(read), MAX_LINE);
            loop {
                match lines.next_line().await {
                    Ok(Some(line)) if said(&line.text) == Said::Ready => {
                        return Ok(Agent { lines, write, log });
                    }
                    Ok(Some(line)) => keep(&mut log, &line),
                    Ok(None) => return Err(failed("the VM stopped before its agent was up".into())),
                    Err(e) => return Err(failed(format!("the VM's agent port failed: {e}"))),
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.unwrap_or_else(|_| {
            Err(failed(format!(
                "the VM's agent did not say hello within {} s (boot_timeout)",
                timeout.as_secs()
            )))
        })
    }

    /// Hands the agent `payload` (the runner's variables and JIT config) and waits for it to
    /// say the runner started.
    pub(super) async fn start(&mut self, payload: &[u8]) -> Result<(), ProvisionError> {
        let failed = |what: String| ProvisionError::EnvironmentFailed(what);
        self.write
            .write_all(payload)
            .await
            .map_err(|e| failed(format!("cannot hand the runner to the VM's agent: {e}")))?;
        loop {
            match self.lines.next_line().await {
                Ok(Some(line)) if said(&line.text) == Said::Started => return Ok(()),
                Ok(Some(line)) => keep(&mut self.log, &line),
                Ok(None) | Err(_) => {
                    return Err(failed("the VM stopped before its runner started".into()));
                }
            }
        }
    }

    /// The runner's exit code, when the agent says it; `None` when the port closes first (the
    /// VM was stopped, or powered off by the job).
    pub(super) async fn exit(mut self) -> Option<i32> {
        while let Ok(Some(line)) = self.lines.next_line().await {
            match said(&line.text) {
                Said::Exit(code) => return Some(code),
                _ => keep(&mut self.log, &line),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncBufReadExt;

    use super::*;

    #[test]
    fn the_agent_s_lines_are_read_and_anything_else_ignored() {
        assert_eq!(said("EPHEMER-AGENT READY 1\r"), Said::Ready);
        assert_eq!(said("STARTED"), Said::Started);
        assert_eq!(said("EXIT 0"), Said::Exit(0));
        assert_eq!(said("EXIT 137\n"), Said::Exit(137));
        assert_eq!(said("EXIT x"), Said::Other);
        assert_eq!(said("EPHEMER-AGENT READY 2"), Said::Other);
        assert_eq!(said(""), Said::Other);
    }

    /// The agent's side played by a test: hello, the payload read, started, exit.
    #[tokio::test]
    async fn a_runner_is_handed_over_and_its_exit_code_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agent.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let guest = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let (read, mut write) = stream.into_split();
            write.write_all(b"noise\r\nEPHEMER-AGENT READY 1\r\n").await.unwrap();
            let mut lines = BufReader::new(read).lines();
            let mut got = Vec::new();
            while let Some(line) = lines.next_line().await.unwrap() {
                let end = line.is_empty();
                got.push(line);
                if end {
                    break;
                }
            }
            got.push(lines.next_line().await.unwrap().unwrap());
            write.write_all(b"STARTED\nEXIT 3\n").await.unwrap();
            got
        });
        let log = dir.path().join("vm.log");
        let file = CappedLog::open(&log, 1 << 20).unwrap();
        let mut agent = Agent::hello(&socket, Duration::from_secs(5), || true, file)
            .await
            .unwrap();
        agent.start(b"A=Yg==\n\nJIT\n").await.unwrap();
        assert_eq!(agent.exit().await, Some(3));
        assert_eq!(guest.await.unwrap(), vec!["A=Yg==", "", "JIT"]);
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "noise\n", "the console's lines");
    }

    /// A guest that writes one endless line, then floods lines, before its hello: the daemon's
    /// memory holds a line's head at most, the log stays under its cap, and the hello that
    /// follows is still heard.
    #[tokio::test]
    async fn an_endless_console_line_and_a_flood_cost_neither_memory_nor_disk() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agent.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let guest = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let chunk = vec![b'x'; 1 << 20];
            for _ in 0..64 {
                stream.write_all(&chunk).await.unwrap();
            }
            for i in 0..20_000 {
                stream
                    .write_all(format!("\nflood line {i:05}").as_bytes())
                    .await
                    .unwrap();
            }
            stream.write_all(b"\nEPHEMER-AGENT READY 1\n").await.unwrap();
            stream
        });
        let log = dir.path().join("vm.log");
        let agent = Agent::hello(
            &socket,
            Duration::from_secs(60),
            || true,
            CappedLog::open(&log, 64 << 10).unwrap(),
        )
        .await
        .unwrap();
        let _guest = guest.await.unwrap();
        let now = std::fs::read_to_string(&log).unwrap();
        let old = std::fs::read_to_string(dir.path().join("vm.log.1")).unwrap();
        assert!(now.len() <= 64 << 10 && old.len() <= 64 << 10);
        assert!(now.contains("flood line 19999"), "the newest lines are kept");
        drop(agent);
    }

    /// A run directory whose path is longer than a socket address holds (a long `state.dir`
    /// made every VM fail before, issue 65 item 10): the agent is reached all the same.
    #[tokio::test]
    async fn a_run_directory_longer_than_a_socket_path_is_reached() {
        use std::os::fd::AsRawFd;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a-state-directory-whose-name-is-long".repeat(4));
        std::fs::create_dir(&dir).unwrap();
        let socket = dir.join("agent.sock");
        assert!(socket.as_os_str().len() > 108);
        assert!(tokio::net::UnixListener::bind(&socket).is_err(), "too long to bind by path");
        // QEMU binds it relative to its working directory; here, through the directory's fd.
        let fd = std::fs::File::open(&dir).unwrap();
        let short = format!("/proc/self/fd/{}/agent.sock", fd.as_raw_fd());
        let listener = tokio::net::UnixListener::bind(&short).unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            stream.write_all(b"EPHEMER-AGENT READY 1\n").await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        let log = CappedLog::open(&tmp.path().join("vm.log"), 1 << 20).unwrap();
        Agent::hello(&socket, Duration::from_secs(5), || true, log)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn no_hello_in_time_or_a_dead_qemu_is_a_failed_environment() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agent.sock");
        let log = || CappedLog::open(&dir.path().join("vm.log"), 1 << 20).unwrap();
        let gone = Agent::hello(&socket, Duration::from_secs(5), || false, log()).await;
        assert!(
            matches!(&gone, Err(ProvisionError::EnvironmentFailed(m)) if m.contains("QEMU exited")),
            "{:?}",
            gone.err()
        );
        let _listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let silent = Agent::hello(&socket, Duration::from_millis(200), || true, log()).await;
        assert!(
            matches!(&silent, Err(ProvisionError::EnvironmentFailed(m)) if m.contains("boot_timeout")),
            "{:?}",
            silent.err()
        );
    }
}
