//! What the QEMU backend reads and says, as plain functions of text: how a VM ended, the tail
//! of its log, whether a process's `stat` says it runs, whether a command line is a VM's
//! QEMU. The backend only reads the files and the kernel's answers and passes them in.

use std::time::Duration;

/// How a VM ended, in words: its runner's exit code as the agent said it (`None`: it never
/// said), and whether the guest powered off within `grace` after.
pub(super) fn how_it_ended(code: Option<i32>, powered_off: bool, grace: Duration) -> String {
    match (code, powered_off) {
        (Some(code), true) => {
            format!("its runner exited with code {code}, then the guest powered off")
        }
        (Some(code), false) => format!(
            "its runner exited with code {code}; the guest did not power off within {} s",
            grace.as_secs()
        ),
        (None, _) => "the VM stopped before its runner said it exited (the guest powered off or \
                      crashed, or QEMU was killed)"
            .to_string(),
    }
}

/// The last three non-blank lines of a log, on one line (`nothing` for none).
pub(super) fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
    if tail.is_empty() {
        "nothing".into()
    } else {
        tail
    }
}

/// Whether a `/proc/PID/stat` line says the process runs: its state (the first field after the
/// command, which may hold spaces and parentheses) is neither zombie nor dead.
pub(super) fn stat_runs(stat: &str) -> bool {
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next())
        .is_some_and(|state| state != 'Z' && state != 'X')
}

/// Whether a `/proc/PID/cmdline` (arguments NUL-separated) is VM `name`'s QEMU: one argument
/// is exactly its `-name` value.
pub(super) fn cmdline_is_vm(cmdline: &[u8], name: &str) -> bool {
    let want = format!("{name},process={name}");
    cmdline
        .split(|b| *b == 0)
        .any(|arg| arg == want.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vm_s_end_is_said_by_what_its_agent_and_qemu_did() {
        let grace = Duration::from_secs(20);
        assert_eq!(
            how_it_ended(Some(0), true, grace),
            "its runner exited with code 0, then the guest powered off"
        );
        assert_eq!(
            how_it_ended(Some(7), false, grace),
            "its runner exited with code 7; the guest did not power off within 20 s"
        );
        assert!(how_it_ended(None, true, grace).starts_with("the VM stopped before its runner"));
        assert_eq!(how_it_ended(None, true, grace), how_it_ended(None, false, grace));
    }

    #[test]
    fn a_log_s_tail_is_its_last_three_lines_that_say_something() {
        assert_eq!(tail(""), "nothing");
        assert_eq!(tail("\n  \n"), "nothing");
        assert_eq!(tail("a\n\nb\nc\n\nd\n"), "b | c | d");
        assert_eq!(tail("qemu: could not open kernel\n"), "qemu: could not open kernel");
    }

    #[test]
    fn a_stat_line_runs_unless_zombie_or_dead_whatever_the_command_holds() {
        assert!(stat_runs("4242 (qemu-system-x86) S 1 4242 4242 0 -1"));
        assert!(stat_runs("4242 (a) b) R 1"));
        assert!(!stat_runs("4242 (qemu) Z 1"));
        assert!(!stat_runs("4242 (qemu) X 1"));
        assert!(!stat_runs("garbage"));
        assert!(!stat_runs(""));
    }

    #[test]
    fn a_command_line_is_the_vm_s_by_its_exact_name_argument() {
        let ours = b"qemu-system-x86_64\0-name\0ephemer-linux-vm-ab12,process=ephemer-linux-vm-ab12\0-m\x004096\0";
        assert!(cmdline_is_vm(ours, "ephemer-linux-vm-ab12"));
        // A prefix of another VM's name, or the name elsewhere, is not it.
        assert!(!cmdline_is_vm(ours, "ephemer-linux-vm-ab1"));
        assert!(!cmdline_is_vm(b"sleep\0ephemer-linux-vm-ab12\0", "ephemer-linux-vm-ab12"));
        assert!(!cmdline_is_vm(b"", "x"));
    }
}
