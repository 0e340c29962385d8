//! The daemon's side of the guest agent's port (`contrib/linux-vm/ephemer-agent`, the VM's
//! init): a line protocol over the VM's serial console, which QEMU serves on a unix socket only
//! the daemon can open (its run directory is 0700). Every other line the guest prints (the
//! kernel's, the runner's) goes to the VM's log.
//!
//! The agent says `EPHEMER-AGENT READY 1` once the guest is up; the daemon answers with the
//! runner's variables and the JIT config (the payload the tart pool sends over ssh); the agent
//! says `STARTED`, then `EXIT <code>` when the runner ends, and powers the VM off.

use std::{path::Path, time::Duration};

use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::UnixStream,
};

use crate::provision::ProvisionError;

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
    lines: tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    write: tokio::net::unix::OwnedWriteHalf,
    log: std::fs::File,
}

/// Keeps a line of the guest's console in the VM's log.
fn keep(log: &mut std::fs::File, line: &str) {
    use std::io::Write;
    let _ = writeln!(log, "{}", line.trim_end());
}

impl Agent {
    /// Connects to the agent's port at `socket` (QEMU makes it as it starts) and waits for the
    /// hello, for up to `timeout` from now; `alive` says whether QEMU still runs.
    pub(super) async fn hello(
        socket: &Path,
        timeout: Duration,
        alive: impl Fn() -> bool,
        mut log: std::fs::File,
    ) -> Result<Agent, ProvisionError> {
        let failed = |what: String| ProvisionError::EnvironmentFailed(what);
        let wait = async {
            let stream = loop {
                if let Ok(s) = UnixStream::connect(socket).await {
                    break s;
                }
                if !alive() {
                    return Err(failed("QEMU exited before the VM's agent port opened".into()));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            let (read, write) = stream.into_split();
            let mut lines = BufReader::new(read).lines();
            loop {
                match lines.next_line().await {
                    Ok(Some(line)) if said(&line) == Said::Ready => {
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
                Ok(Some(line)) if said(&line) == Said::Started => return Ok(()),
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
            match said(&line) {
                Said::Exit(code) => return Some(code),
                _ => keep(&mut self.log, &line),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
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
        let file = std::fs::File::create(&log).unwrap();
        let mut agent = Agent::hello(&socket, Duration::from_secs(5), || true, file)
            .await
            .unwrap();
        agent.start(b"A=Yg==\n\nJIT\n").await.unwrap();
        assert_eq!(agent.exit().await, Some(3));
        assert_eq!(guest.await.unwrap(), vec!["A=Yg==", "", "JIT"]);
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "noise\n", "the console's lines");
    }

    #[tokio::test]
    async fn no_hello_in_time_or_a_dead_qemu_is_a_failed_environment() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agent.sock");
        let log = || std::fs::File::create(dir.path().join("vm.log")).unwrap();
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
