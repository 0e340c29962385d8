//! `ephemer-actors jobs ID` as a person reads it: the job, what it is (name, workflow, branch,
//! run, trigger), where it stands, and its timeline in words.

use std::fmt::Write as _;

use ephemer_actors_core::{admin::JobAnswer, scheduler::core::Phase};

use crate::{
    ctl::{or_dash, phase_provider, state_text, when},
    term::one_line,
};

/// The text `jobs ID` prints.
pub fn job_text(id: u64, v: &JobAnswer) -> String {
    let j = &v.job;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "job {} in {}/{}  labels {}",
        id,
        one_line(&j.key.owner),
        one_line(&j.repo),
        one_line(&j.labels.join(","))
    );
    if let Some(a) = &j.about {
        let _ = writeln!(
            out,
            "name {}  workflow {}  branch {}  triggered by {}",
            one_line(dash(&a.name)),
            one_line(dash(&a.workflow)),
            one_line(dash(&a.branch)),
            one_line(dash(&a.sender))
        );
    }
    if j.run_id != 0 {
        let _ = writeln!(out, "run {}  attempt {}", j.run_id, j.run_attempt);
    }
    let _ = writeln!(
        out,
        "state {}  provider {}  runner {}  retries {}  first failure class {}",
        state_text(&j.phase),
        phase_provider(&j.phase),
        one_line(&or_dash(j.runner_name.as_deref())),
        j.retry_attempts,
        or_dash(j.error_class)
    );
    match j.phase {
        Phase::Parked { look_unix, .. } => {
            let _ = writeln!(
                out,
                "looked at again {} (idle reaps {})",
                when(look_unix),
                j.idle_reaps
            );
        }
        _ => {
            if let Some(next) = j.next_attempt_unix {
                let _ = writeln!(out, "next attempt {}", when(next));
            }
        }
    }
    if let Some(l) = &v.ledger {
        let _ = writeln!(
            out,
            "fleet: {}  held by {}  ({})",
            l.phase,
            or_dash(l.holder.as_deref()),
            l.why
        );
    }
    let _ = writeln!(out, "\ntimeline:");
    for n in &j.timeline {
        let _ = writeln!(out, "  {}  {}", when(n.at()), one_line(&n.note.to_string()));
    }
    out
}

fn dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ephemer_actors_core::scheduler::core::{
        TimelineEntry,
        timeline_words::{every_kind, kind_of, reads_as_code},
    };

    /// Every kind of note, and a job in each phase, printed by `jobs ID`: words only.
    #[test]
    fn jobs_id_prints_every_note_kind_in_words() {
        let phases = [
            serde_json::json!({ "state": "pending" }),
            serde_json::json!({ "state": "parked", "reason": "zombie", "look_unix": 1_796_259_723u64 }),
            serde_json::json!({ "state": "active", "provider": "linux", "runner": "r1" }),
            serde_json::json!({ "state": "done" }),
        ];
        for phase in phases {
            let mut v: JobAnswer = serde_json::from_value(serde_json::json!({
                "job": {
                    "key": { "owner": "acme", "job_id": 42 }, "repo": "app", "labels": ["linux"],
                    "phase": phase, "pending": false, "seen": true, "started": false,
                    "admissions": 1, "retry_attempts": 0, "error_class": null,
                    "next_attempt_unix": null, "runner_name": null, "run_id": 7,
                    "about": { "name": "build", "workflow": "ci", "branch": "", "sender": "octocat" },
                    "timeline": [],
                },
                "retry": null,
                "runners": [],
            }))
            .expect("a job answer");
            for note in every_kind() {
                v.job.timeline = vec![TimelineEntry {
                    at_ms: 1_796_259_723_000,
                    note: note.clone(),
                }];
                let text = job_text(42, &v);
                assert_eq!(
                    reads_as_code(&text),
                    None,
                    "{} reads as code:\n{text}",
                    kind_of(&note)
                );
            }
        }
    }

    /// A job name from a webhook carrying escape sequences and a forged line (issue 65, item
    /// 9): nothing of it reaches the terminal as a control character.
    #[test]
    fn names_from_github_reach_the_terminal_escaped() {
        let v: JobAnswer = serde_json::from_value(serde_json::json!({
            "job": {
                "key": { "owner": "acme", "job_id": 42 }, "repo": "app\x1b]0;pwned\x07",
                "labels": ["linux"], "phase": { "state": "pending" }, "pending": false,
                "seen": true, "started": false, "admissions": 1, "retry_attempts": 0,
                "error_class": null, "next_attempt_unix": null, "runner_name": null, "run_id": 7,
                "about": { "name": "build\x1b[2J\nstate done", "workflow": "ci\u{9b}31m", "branch": "main\u{202e}", "sender": "o" },
                "timeline": [],
            },
            "retry": null,
            "runners": [],
        }))
        .expect("a job answer");
        let text = job_text(42, &v);
        assert!(
            !text
                .chars()
                .any(|c| c.is_control() && c != '\n' || c == '\u{202e}'),
            "{text:?}"
        );
        assert!(!text.lines().any(|l| l.starts_with("state done")), "{text}");
        assert!(text.contains("build\\u{1b}[2J\\u{a}state done"), "{text}");
    }
}
