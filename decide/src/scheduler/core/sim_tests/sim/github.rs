//! What the simulated GitHub does with the daemon's effects (claims, deletions, looks,
//! assignment of queued jobs to idle runners), and the invariants checked after every step.

use super::*;
use crate::scheduler::core::*;
use crate::{
    github::{GithubError, JitRunner},
    job::JobAction,
    provision::ExitReason,
};

impl Sim {
    pub(super) fn carry_out(&mut self, fx: Vec<Effect>) {
        self.store.apply(self.core.take_ops());
        self.core.take_observations();
        for effect in fx {
            self.effect(effect);
        }
    }

    pub(super) fn effect(&mut self, effect: Effect) {
        let e = self.epoch;
        match effect {
            Effect::Claim {
                key,
                provider,
                request,
            } => {
                let latency = self.jitter(5, 300);
                let faults = self.plan.claim_faults;
                let result = if self.faulty(faults) {
                    if self.rng.random_bool(0.75) {
                        Err(http(502, "generate_jitconfig"))
                    } else {
                        Err(GithubError::Network {
                            endpoint: "generate_jitconfig",
                            detail: "dropped".into(),
                        })
                    }
                } else {
                    let id = self.next_reg;
                    self.next_reg += 1;
                    let name = format!("{}{id}", request.name_base);
                    self.regs.insert(
                        id,
                        Reg {
                            name: name.clone(),
                            busy: None,
                        },
                    );
                    self.claims += 1;
                    Ok(JitRunner {
                        id,
                        name,
                        encoded_jit_config: Secret::new("jit"),
                    })
                };
                self.after(latency, Ev::ClaimAnswer(e, key, provider, result));
            }
            Effect::Provision { spec, .. } => {
                self.procs
                    .insert(spec.name.clone(), (spec.runner_id, Proc::Booting));
                let boot = self.jitter(100, 3000);
                let crashes = self.plan.crashes;
                if self.faulty(crashes) {
                    self.after(boot, Ev::Crash(spec.name));
                } else {
                    self.after(boot, Ev::Boot(spec.name));
                }
            }
            Effect::Teardown { name, .. } => {
                match self.procs.get(&name).map(|(_, p)| p.clone()) {
                    Some(Proc::Running(id)) => self.violations.push(format!(
                        "t={} runner {name} torn down while running job {id}",
                        self.t
                    )),
                    Some(Proc::Dead) | None => return,
                    _ => {}
                }
                self.procs.get_mut(&name).unwrap().1 = Proc::Dead;
                self.after(10, Ev::Exit(name, None, ExitReason::TornDown));
            }
            Effect::DeleteRunner(Deletion {
                runner_id,
                ref name,
                ..
            }) => {
                let fails = self.plan.failed_deletes;
                let result = if self.faulty(fails) {
                    Err(http(500, "delete_runner"))
                } else {
                    if self.ran.contains_key(name) {
                        self.needless_deletes += 1;
                    }
                    self.regs.remove(&runner_id);
                    Ok(())
                };
                let latency = self.jitter(5, 200);
                self.after(latency, Ev::Deleted(e, effect, result));
            }
            Effect::CheckIdle {
                name,
                runner_id,
                reason,
                ..
            } => {
                let result = match self.regs.get(&runner_id) {
                    Some(r) if r.busy.is_some() => Ok(true),
                    _ => {
                        self.regs.remove(&runner_id);
                        Ok(false)
                    }
                };
                let latency = self.jitter(5, 200);
                self.after(latency, Ev::IdleAnswer(e, name, result, reason));
            }
            Effect::ArmTimer { at } => {
                self.timer_armed = at.map(|at| {
                    let ms = self.ms(at);
                    self.at(ms, Ev::Timer(e, ms));
                    ms
                });
            }
            Effect::LookAtJob { key, .. } => {
                let status = match self.gh_jobs.get(&key.job_id) {
                    Some(j) => Ok(j.status.to_string()),
                    None => Err(http(404, "get_job")),
                };
                self.after(50, Ev::Looked(e, key, status));
            }
        }
    }

    /// GitHub hands each idle runner a queued job its labels cover, by the plan's policy.
    pub(super) fn assign(&mut self) {
        let idle: Vec<String> = self
            .procs
            .iter()
            .filter(|(_, (reg, p))| *p == Proc::Idle && self.regs.contains_key(reg))
            .map(|(n, _)| n.clone())
            .collect();
        let mut idle = idle;
        idle.sort();
        for name in idle {
            let queued: Vec<u64> = self
                .gh_jobs
                .iter()
                .filter(|(_, j)| j.status == "queued")
                .map(|(id, _)| *id)
                .collect();
            let Some(&id) = (match self.plan.policy {
                Policy::OldestFirst => queued.first(),
                Policy::NewestFirst => queued.last(),
                Policy::Random if queued.is_empty() => None,
                Policy::Random => queued.get(self.rng.random_range(0..queued.len())),
            }) else {
                return;
            };
            let reg = self.procs[&name].0;
            self.procs.get_mut(&name).unwrap().1 = Proc::Running(id);
            self.regs.get_mut(&reg).unwrap().busy = Some(id);
            let j = self.gh_jobs.get_mut(&id).unwrap();
            j.status = "in_progress";
            j.runner = Some(name.clone());
            self.deliver(JobAction::InProgress, id);
            let runs = self.jitter(200, 2000);
            self.after(runs, Ev::JobDone(name));
        }
    }

    /// The invariants that hold at every moment.
    pub(super) fn check(&mut self) {
        let t = self.t;
        let allowance = RECONCILE + 5_000;
        let mut queued = 0;
        for (id, j) in &self.gh_jobs {
            if j.status != "queued" {
                self.idle_since.remove(id);
                continue;
            }
            queued += 1;
            let phase = self
                .core
                .view()
                .job(&JobKey::new("acme", *id))
                .map(|r| r.phase().clone());
            if let Some(Phase::Parked { reason, .. }) = &phase {
                self.violations
                    .push(format!("t={t} job {id} parked ({reason:?}) while queued"));
            }
            let active = matches!(
                phase,
                Some(
                    Phase::Pending
                        | Phase::Claiming { .. }
                        | Phase::Retrying
                        | Phase::Active { .. }
                )
            );
            if active {
                self.idle_since.remove(id);
            } else {
                let since = *self.idle_since.entry(*id).or_insert(t);
                if t - since > allowance {
                    self.violations.push(format!(
                        "t={t} job {id} queued on GitHub, held as {phase:?} since t={since}"
                    ));
                    self.idle_since.insert(*id, t);
                }
            }
        }
        let unbound = self
            .core
            .view()
            .runners()
            .filter(|r| r.bound.is_none() && !r.tearing_down() && !r.registration_deleted())
            .count();
        if unbound > queued {
            let since = *self.surplus_since.get_or_insert(t);
            if t - since > GRACE + 30_000 + 60_000 + 5_000 {
                self.violations.push(format!(
                    "t={t} {unbound} unbound runners for {queued} queued jobs since t={since}"
                ));
                self.surplus_since = Some(t);
            }
        } else {
            self.surplus_since = None;
        }
    }

    /// What is wrong at the end.
    pub(in crate::scheduler::core::sim_tests) fn verdict(mut self) -> Vec<String> {
        let lost: Vec<u64> = self
            .gh_jobs
            .iter()
            .filter(|(_, j)| j.status != "completed")
            .map(|(id, _)| *id)
            .collect();
        if !lost.is_empty() {
            let views: Vec<String> = lost
                .iter()
                .take(3)
                .map(|id| {
                    let key = JobKey::new("acme", *id);
                    match self.core.view().job(&key) {
                        Some(r) => format!(
                            "{id}: {:?} {}",
                            r.phase(),
                            r.timeline()
                                .iter()
                                .map(|e| e.note.to_string())
                                .collect::<Vec<_>>()
                                .join(" | ")
                        ),
                        None => format!("{id}: unknown"),
                    }
                })
                .collect();
            self.violations
                .push(format!("jobs never ran: {lost:?}\n{}", views.join("\n")));
        }
        if !self.regs.is_empty() {
            self.violations
                .push(format!("registrations left: {:?}", self.regs));
        }
        if self.core.view().runner_count() > 0 {
            let left: Vec<String> = self
                .core
                .view()
                .runners()
                .map(|r| {
                    let job = self.core.view().job(&r.intent).map(|j| {
                        (
                            j.phase().clone(),
                            j.started_at().is_some(),
                            j.timeline().iter().map(|e| e.note.to_string()).collect::<Vec<_>>(),
                        )
                    });
                    format!(
                        "{} bound {:?} tearing {} busy {} deleted {} pending {} proc {:?} intent {:?}",
                        r.name,
                        r.bound,
                        r.tearing_down(),
                        r.seen_busy(),
                        r.registration_deleted(),
                        r.idle_check_pending(),
                        self.procs.get(&r.name),
                        job
                    )
                })
                .collect();
            self.violations
                .push(format!("runners left in the ledger: {left:#?}"));
        }
        if self.needless_deletes > 0 {
            self.violations.push(format!(
                "{} runners that ran a job were deleted again",
                self.needless_deletes
            ));
        }
        self.violations
    }
}
