//! One long poll of a scale set's queue, and the message it brings: its offered jobs acquired,
//! its job events handed to the intake, its id kept and acknowledged once all are durable.
//! What each message means is `inbox`'s; this file carries it out.

use std::time::Duration;

use super::{
    ack_settles, inbox,
    lease::renew_lease,
    link::Link,
    machine::{Fail, Polled},
};
use crate::{
    github::{
        GithubError,
        actions::types::{QueueMessage, Session},
    },
    scheduler::{JobEvent, messages::EventSource},
    webhook::{Deliver, Verdict},
};

/// One long poll, with the message it brings handled. Fleet mode renews the lease while the
/// poll waits.
pub(super) async fn poll_once(link: &mut Link, set: u64, capacity: usize) -> Result<Polled, Fail> {
    let Some(session) = link.session.clone() else {
        return Err(Fail::NotFound);
    };
    settle_acks(link, &session).await;
    let last = link.mark.last_message_id;
    let client = link.client.clone();
    let get = client.get_message(&session, last, capacity);
    tokio::pin!(get);
    let every = link
        .wiring
        .ledger
        .as_ref()
        .map_or(Duration::from_secs(3600), |l| l.heartbeat_every());
    let answer = loop {
        tokio::select! {
            answer = &mut get => break answer,
            () = tokio::time::sleep(every) => {
                if !renew_lease(link, &session).await {
                    return Ok(Polled::LostLease);
                }
            }
        }
    };
    match answer {
        Ok(None) => Ok(Polled::Nothing),
        Ok(Some(message)) => match handle(link, set, &session, message).await {
            Ok(()) => Ok(Polled::Handled),
            Err(e) => {
                // Not acknowledged: the queue hands the message out again.
                tracing::warn!(pool = link.pool(), error = %e, "scale set: a message could not be handled; it comes again");
                Ok(Polled::NotHandled)
            }
        },
        Err(e) => {
            tracing::debug!(pool = link.pool(), error = %e, "scale set: the poll failed");
            Err(Fail::from(&e))
        }
    }
}

/// Why a message was not handled (it is not acknowledged: the queue hands it out again).
#[derive(Debug, thiserror::Error)]
enum Unhandled {
    /// Its offered jobs could not be acquired.
    #[error("acquiring jobs: {0}")]
    Acquire(GithubError),
    /// The intake refused one of its jobs.
    #[error("the intake refused job {0}: {1}")]
    Refused(u64, String),
    /// The intake is gone (the daemon is stopping).
    #[error("the intake is gone: {0}")]
    IntakeGone(String),
}

/// Handles one message: acquires its offered jobs, hands its job events to the intake, and
/// once all are durable keeps its id (with the assignments it counted) and acknowledges it.
/// What cannot be read is counted, logged with the message's id, and acknowledged too.
async fn handle(
    link: &mut Link,
    set: u64,
    session: &Session,
    message: QueueMessage,
) -> Result<(), Unhandled> {
    if let Some(stats) = &message.statistics {
        link.observe(stats);
    }
    if link.mark.handled_before(message.id) {
        // Handled before (the service answered from before `lastMessageId`): acknowledge only.
        let _ = link.client.delete_message(session, message.id).await;
        return Ok(());
    }
    // Worked on a copy: the mark changes only once every job in the message is durable.
    let mut mark = link.mark.clone();
    let pin = crate::config::scaleset_pin(&link.settings.pool);
    let handled = inbox::handle(
        &message,
        set,
        link.client.owner(),
        &pin,
        &mut mark,
        crate::clock::unix_now(),
    );
    let pool = link.pool();
    if let Some(why) = &handled.unreadable {
        tracing::warn!(
            pool,
            message_id = message.id,
            "scale set: {why}; counted as unreadable and acknowledged so the queue goes on"
        );
    }
    if !handled.acquire.is_empty() {
        acquire(link, set, session, &handled.acquire).await?;
    }
    deliver_all(link, handled.deliveries).await?;
    let pool = link.pool();
    for (label, n) in handled.counts {
        link.metrics
            .scaleset
            .messages
            .with_label_values(&[pool, label])
            .inc_by(n);
    }
    if handled.withdrawn > 0 {
        tracing::info!(
            pool,
            jobs = handled.withdrawn,
            message_id = message.id,
            "scale set: the service withdrew jobs no runner took in time; their next assignment gets a runner"
        );
    }
    // Kept with the acknowledgement owed, before it is asked: a poll past the message never
    // brings it back, but the service keeps it until it is deleted, even across a restart.
    mark.handled(message.id);
    link.mark = mark;
    link.save_mark().await;
    match link.client.delete_message(session, message.id).await {
        Ok(()) => link.mark.acked(message.id),
        Err(e) => {
            tracing::debug!(pool = link.pool(), error = %e, "scale set: acknowledging a message failed; asked again before the next poll")
        }
    }
    Ok(())
}

/// Hands a message's job events to the intake, each as a delivery of its own; any it does
/// not take leaves the message unacknowledged.
async fn deliver_all(link: &Link, deliveries: Vec<inbox::Delivery>) -> Result<(), Unhandled> {
    for delivery in deliveries {
        let job_id = delivery.job.key.job_id;
        let event = JobEvent {
            delivery_id: Some(delivery.id),
            action: delivery.action,
            job: delivery.job,
            received: crate::clock::mono_now(),
            source: EventSource::ScaleSet,
        };
        match link.wiring.intake.send(Deliver(event)).await {
            Ok(Verdict::Accepted | Verdict::IgnoredAction | Verdict::Replayed) => {}
            Ok(other) => return Err(Unhandled::Refused(job_id, format!("{other:?}"))),
            Err(e) => return Err(Unhandled::IntakeGone(e.to_string())),
        }
    }
    Ok(())
}

/// Asks again for the acknowledgements owed (a failed DELETE, or one cut short by a crash);
/// a message the queue no longer has counts as acknowledged (`Mark::acks_settled` keeps the rest).
async fn settle_acks(link: &mut Link, session: &Session) {
    let owed = link.mark.owed_acks.clone();
    if owed.is_empty() {
        return;
    }
    let mut done = Vec::new();
    for id in owed {
        let answer = link.client.delete_message(session, id).await;
        let answer = answer.map_err(|e| match e {
            GithubError::Http(f) => Some(f.status),
            _ => None,
        });
        if ack_settles(answer) {
            done.push(id);
        }
    }
    link.mark.acks_settled(&done);
}

/// Acquires offered jobs (a GHES offers before it assigns); what was not acquired went to
/// another scale set or was cancelled meanwhile.
async fn acquire(
    link: &Link,
    set: u64,
    session: &Session,
    ids: &[u64],
) -> Result<(), Unhandled> {
    let pool = link.pool();
    let metrics = &link.metrics.scaleset;
    match link.client.acquire_jobs(set, session, ids).await {
        Ok(acquired) => {
            let lost = ids.len().saturating_sub(acquired.len());
            metrics
                .acquire
                .with_label_values(&[pool, "acquired"])
                .inc_by(acquired.len() as u64);
            metrics
                .acquire
                .with_label_values(&[pool, "lost"])
                .inc_by(lost as u64);
            Ok(())
        }
        Err(GithubError::Http(f)) if f.status == 404 => {
            // A service without job acquisition: the jobs are assigned without it.
            metrics
                .acquire
                .with_label_values(&[pool, "error"])
                .inc_by(ids.len() as u64);
            tracing::warn!(
                pool,
                "scale set: this server has no acquirejobs (see docs/operations.md for the version floor)"
            );
            Ok(())
        }
        Err(e) => {
            metrics
                .acquire
                .with_label_values(&[pool, "error"])
                .inc_by(ids.len() as u64);
            Err(Unhandled::Acquire(e))
        }
    }
}

