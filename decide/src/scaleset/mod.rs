//! A scale-set listener's decisions: its session's states and backoff ([`machine`]), what a
//! message's job messages mean for the jobs this host holds ([`inbox`]), and the mark it keeps
//! across restarts ([`Mark`]). The listener in `ephemer-actors-core` does the HTTP and feeds
//! what it hears in.

pub mod inbox;
pub mod machine;
#[cfg(test)]
mod machine_tests;
pub mod reckoning;

/// The store mark a pool's listener keeps: `scaleset:<owner>/<pool>`.
pub fn mark_of(owner: &str, pool: &str) -> String {
    format!("scaleset:{}/{pool}", owner.to_ascii_lowercase())
}

/// What a listener keeps across restarts.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Mark {
    /// The scale set's id.
    #[serde(default)]
    pub scale_set_id: u64,
    /// The last message handled and acknowledged.
    #[serde(default)]
    pub last_message_id: u64,
    /// This host's last session, closed at the next start so the host does not wait out its
    /// own session (after a `kill -9`).
    #[serde(default)]
    pub session_id: Option<String>,
    /// Jobs (runner request ids) still waiting when the scale set was made again: GitHub
    /// assigns them anew in the new scale set, so these may be withdrawn when the new one's
    /// statistics do not count them (see `reckon`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub orphans: Vec<u64>,
    /// Jobs the service withdrew and may assign again, with how many times ([`inbox`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub assignments: Vec<inbox::Assignment>,
    /// Written by a daemon that keys scale-set jobs by `jobId` ([`inbox`]); a mark without it
    /// comes from before, whose waiting jobs are withdrawn once (their messages name other
    /// keys now).
    #[serde(default)]
    pub keyed_by_job_id: bool,
    /// Messages handled whose acknowledgement is owed (written before it is asked, so a crash
    /// between the two is settled at the next start).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owed_acks: Vec<u64>,
    /// The labels the service dropped when the scale set was registered with them (a GHES
    /// without custom scale-set labels): asked again only when the pool's labels change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped_labels: Vec<String>,
}

impl Mark {
    /// The scale set was made again as `id`: its queue starts over (no message handled, none
    /// owed), its jobs are keyed by `jobId`; the session to close, the assignments and the
    /// labels the service dropped carry over; `orphans` are the old scale set's jobs left to
    /// the reckoning.
    pub fn remade(&mut self, id: u64, orphans: Vec<u64>) {
        *self = Mark {
            scale_set_id: id,
            orphans,
            session_id: self.session_id.take(),
            assignments: std::mem::take(&mut self.assignments),
            dropped_labels: std::mem::take(&mut self.dropped_labels),
            last_message_id: 0,
            owed_acks: Vec::new(),
            keyed_by_job_id: true,
        };
    }

    /// What the scale set's id, just resolved as `id`, asks of the jobs recorded before.
    pub fn on_resolved(&self, id: u64) -> Resolved {
        if self.scale_set_id != id {
            Resolved::Remade {
                withdraw_waiting: self.scale_set_id != 0,
            }
        } else if !self.keyed_by_job_id {
            Resolved::Upgraded
        } else {
            Resolved::Same
        }
    }

    /// The upgrade's one-time withdrawal was carried out; `left` are the jobs whose withdrawal
    /// the intake did not take (the reckoning withdraws them later). Never asked again.
    pub fn upgraded(&mut self, left: Vec<u64>) {
        self.orphans.extend(left);
        self.keyed_by_job_id = true;
    }

    /// Whether message `id` was handled before (the service answered from before the last
    /// one handled): it is only acknowledged.
    pub fn handled_before(&self, id: u64) -> bool {
        self.last_message_id > 0 && id <= self.last_message_id
    }

    /// Message `id` was handled: the next poll starts after it, and its acknowledgement is
    /// owed until the service takes it (kept before it is asked, so a crash between the two
    /// is settled at the next start).
    pub fn handled(&mut self, id: u64) {
        self.last_message_id = id;
        self.owed_acks.push(id);
    }

    /// The service took message `id`'s acknowledgement.
    pub fn acked(&mut self, id: u64) {
        self.owed_acks.retain(|owed| *owed != id);
    }

    /// The owed acknowledgements `settled` were said (the service took them, or answered 404:
    /// the message is gone anyway); the rest stay owed, the newest [`OWED_ACKS_KEPT`] of
    /// them (an older one the service never took is redelivered and handled again, which its
    /// keys make harmless).
    pub fn acks_settled(&mut self, settled: &[u64]) {
        self.owed_acks.retain(|id| !settled.contains(id));
        let over = self.owed_acks.len().saturating_sub(OWED_ACKS_KEPT);
        self.owed_acks.drain(..over);
    }
}

/// What a resolved scale-set id asks of the jobs recorded before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    /// The scale set the mark knows: nothing.
    Same,
    /// Another scale set (made again, or the first): its queue starts over
    /// ([`Mark::remade`]); the old one's waiting jobs are withdrawn when there was an old one.
    Remade {
        /// There was a scale set before, whose waiting jobs the service assigns anew.
        withdraw_waiting: bool,
    },
    /// The first start after the upgrade to `jobId` keys: the jobs recorded by runner request
    /// id are withdrawn once ([`Mark::upgraded`]).
    Upgraded,
}

/// Whether an acknowledgement's answer settles it: taken, or a 404 (the queue no longer has
/// the message); any other failure leaves it owed.
pub fn ack_settles(answer: Result<(), Option<u16>>) -> bool {
    matches!(answer, Ok(()) | Err(Some(404)))
}

/// The most owed acknowledgements a mark keeps.
pub const OWED_ACKS_KEPT: usize = 100;

/// The labels of `wanted` the service's answer does not keep (`kept`, any case): a GHES
/// without custom scale-set labels keeps the name alone.
pub fn dropped_labels<'a>(wanted: &'a [String], kept: &[String]) -> Vec<&'a String> {
    wanted
        .iter()
        .filter(|l| !kept.iter().any(|k| k.eq_ignore_ascii_case(l)))
        .collect()
}

/// Whether two label lists name the same labels (any case, any order, repeats aside).
pub fn same_labels(a: &[String], b: &[String]) -> bool {
    let norm = |v: &[String]| {
        let mut v: Vec<String> = v.iter().map(|l| l.to_ascii_lowercase()).collect();
        v.sort();
        v.dedup();
        v
    };
    norm(a) == norm(b)
}

/// Whether the scale set found by name will do as it is, so no update is sent: its runner
/// settings are the pool's, and its labels are the pool's, or they are what the service
/// dropped before (`dropped_before`, the mark's): a service that keeps only the name would
/// drop them again, and asking on every start would be in vain.
pub fn found_will_do(
    found_labels: &[String],
    same_settings: bool,
    wanted: &[String],
    dropped_before: &[String],
) -> bool {
    same_settings && (same_labels(found_labels, wanted) || same_labels(dropped_before, wanted))
}

/// What the mark remembers after the service answered a create or an update keeping `kept`
/// of `wanted`: the wanted labels when it dropped any (not to be asked for again until the
/// pool's labels change), else nothing.
pub fn dropped_after(wanted: &[String], kept: &[String]) -> Vec<String> {
    if dropped_labels(wanted, kept).is_empty() {
        Vec::new()
    } else {
        wanted.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resolved_id_asks_for_a_fresh_start_a_one_time_withdrawal_or_nothing() {
        let fresh = Mark::default();
        assert_eq!(
            fresh.on_resolved(7),
            Resolved::Remade {
                withdraw_waiting: false
            },
            "the first scale set: nothing of an old one to withdraw"
        );
        let mut known = Mark {
            scale_set_id: 7,
            ..Mark::default()
        };
        assert_eq!(
            known.on_resolved(7),
            Resolved::Upgraded,
            "a mark from before jobId keys"
        );
        known.upgraded(vec![3]);
        assert_eq!(
            known.on_resolved(7),
            Resolved::Same,
            "the withdrawal happens once"
        );
        assert_eq!(
            known.orphans,
            [3],
            "what the intake did not take is the reckoning's"
        );
        assert_eq!(
            known.on_resolved(8),
            Resolved::Remade {
                withdraw_waiting: true
            }
        );
    }

    #[test]
    fn a_handled_message_is_owed_its_acknowledgement_until_it_is_taken() {
        let mut m = Mark::default();
        assert!(!m.handled_before(1), "nothing handled yet");
        m.handled(5);
        assert!(m.handled_before(5) && m.handled_before(4) && !m.handled_before(6));
        m.handled(6);
        assert_eq!(m.owed_acks, [5, 6]);
        m.acked(5);
        assert_eq!(m.owed_acks, [6]);
        assert!(ack_settles(Ok(())) && ack_settles(Err(Some(404))));
        assert!(
            !ack_settles(Err(Some(500))) && !ack_settles(Err(None)),
            "asked again"
        );
    }

    fn labels(l: &[&str]) -> Vec<String> {
        l.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn labels_compare_in_any_case_and_order() {
        assert!(same_labels(
            &labels(&["Linux", "alpha"]),
            &labels(&["alpha", "linux"])
        ));
        assert!(!same_labels(
            &labels(&["alpha"]),
            &labels(&["alpha", "linux"])
        ));
    }

    /// The "do not PATCH" choice: labels the service dropped before are not asked for again
    /// while the pool's labels stay; a change of labels or settings is sent.
    #[test]
    fn a_found_scale_set_is_updated_only_when_asking_can_change_it() {
        let wanted = labels(&["pool", "self-hosted", "gpu"]);
        let name_only = labels(&["pool"]);
        assert!(found_will_do(&wanted, true, &wanted, &[]));
        assert!(
            !found_will_do(&wanted, false, &wanted, &[]),
            "settings changed"
        );
        assert!(
            !found_will_do(&name_only, true, &wanted, &[]),
            "labels differ, never dropped"
        );
        assert!(
            found_will_do(&name_only, true, &wanted, &wanted),
            "dropped before: not again"
        );
        let changed = labels(&["pool", "self-hosted", "gpu", "big"]);
        assert!(
            !found_will_do(&name_only, true, &changed, &wanted),
            "the pool's labels changed"
        );
        assert!(
            !found_will_do(&name_only, false, &wanted, &wanted),
            "settings still sent"
        );
    }

    #[test]
    fn the_mark_remembers_the_wanted_labels_only_when_some_were_dropped() {
        let wanted = labels(&["pool", "gpu"]);
        assert_eq!(dropped_after(&wanted, &labels(&["pool"])), wanted);
        assert!(dropped_after(&wanted, &labels(&["POOL", "GPU"])).is_empty());
    }

    /// A mark with every field set.
    fn full() -> Mark {
        Mark {
            scale_set_id: 3,
            last_message_id: 17,
            session_id: Some("s".into()),
            orphans: vec![5],
            assignments: vec![inbox::Assignment {
                ident: "j".into(),
                ordinal: 1,
                at: 9,
                started: false,
            }],
            dropped_labels: vec!["linux".into()],
            owed_acks: vec![16],
            keyed_by_job_id: true,
        }
    }

    #[test]
    fn the_mark_survives_json_and_an_older_one_reads() {
        let m = full();
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(serde_json::from_value::<Mark>(v).unwrap(), m);
        let old: Mark =
            serde_json::from_value(serde_json::json!({ "last_message_id": 4 })).unwrap();
        assert_eq!(old.last_message_id, 4);
        assert!(
            !old.keyed_by_job_id,
            "a mark from before jobId keys says so"
        );
        assert_eq!(mark_of("Acme", "linux"), "scaleset:acme/linux");
    }

    #[test]
    fn a_scale_set_made_again_starts_its_queue_over_and_keeps_what_carries() {
        let mut m = Mark {
            keyed_by_job_id: false,
            ..full()
        };
        m.remade(4, vec![7, 8]);
        assert_eq!((m.scale_set_id, m.last_message_id), (4, 0));
        assert_eq!(m.orphans, vec![7, 8]);
        assert!(m.owed_acks.is_empty() && m.keyed_by_job_id);
        assert_eq!(m.session_id.as_deref(), Some("s"));
        assert_eq!(m.assignments.len(), 1);
        assert_eq!(m.dropped_labels, vec!["linux".to_string()]);
    }

    #[test]
    fn settled_acks_leave_and_only_the_newest_owed_ones_stay() {
        let mut m = Mark {
            owed_acks: (1..=105).collect(),
            ..full()
        };
        m.acks_settled(&[2, 3]);
        assert_eq!(m.owed_acks.len(), OWED_ACKS_KEPT);
        assert_eq!(m.owed_acks.first(), Some(&6), "the oldest go past the cap");
        assert_eq!(m.owed_acks.last(), Some(&105));
        m.acks_settled(&m.owed_acks.clone());
        assert!(m.owed_acks.is_empty());
        let mut few = Mark {
            owed_acks: vec![7, 8, 9],
            ..full()
        };
        few.acks_settled(&[8, 40]);
        assert_eq!(few.owed_acks, vec![7, 9], "an unknown id changes nothing");
    }

    #[test]
    fn labels_the_answer_does_not_keep_are_dropped_in_any_case() {
        let wanted: Vec<String> = vec!["pool".into(), "Linux".into(), "gpu".into()];
        let kept: Vec<String> = vec!["pool".into(), "linux".into()];
        assert_eq!(dropped_labels(&wanted, &kept), vec![&"gpu".to_string()]);
        assert!(dropped_labels(&wanted, &wanted).is_empty());
    }
}
