//! The ledger's schema: versioned migrations embedded in the binary, applied at start under an
//! advisory lock (so hosts starting together apply each one once).
//!
//! Hosts are upgraded one at a time, so for a while two versions share the ledger. Each
//! migration says the oldest schema version whose binaries keep working once it is applied
//! (`readable_from`, recorded with it): an additive one (a new table, a new column with a
//! default, a new function) keeps the version before it, so a host of the previous release
//! keeps running, and starts, while another host has migrated forward. A schema that needs a
//! newer binary than this one (a change the previous release would misread) is refused at
//! start with an error naming the version it needs: that host's jobs wait in the ledger for
//! the others (its lease expires), none is lost. docs/fleet.md, "Upgrading a fleet".

use tokio_postgres::Client;

use super::LedgerError;

/// The advisory lock key the migrations run under (any constant; "ephemer" in ASCII).
const MIGRATION_LOCK: i64 = 0x0065_7068_656d_6572;

/// A migration, and the oldest schema version whose binaries keep working once it is applied.
struct Migration {
    sql: &'static str,
    readable_from: i32,
}

/// Migrations in order; the schema version is the number applied. Versions 2 to 4 came before
/// the rule and are taken to need their own version. The last one is the next release's
/// (crate::next_build, never shipped): one more, additive, so hosts of this release keep
/// working beside it; only a process that plays the next release applies it.
const MIGRATIONS: &[Migration] = &[
    Migration::needs(V1, 1),
    Migration::needs(V2, 2),
    Migration::needs(V3, 3),
    Migration::needs(V4, 4),
    Migration::needs("ALTER TABLE ephemer_jobs ADD COLUMN accepted_by text", 4),
];

/// The migrations this process knows: all but the next release's, unless it plays that one.
fn migrations() -> &'static [Migration] {
    if crate::next_build::on() {
        MIGRATIONS
    } else {
        &MIGRATIONS[..MIGRATIONS.len() - 1]
    }
}

impl Migration {
    const fn needs(sql: &'static str, readable_from: i32) -> Self {
        Migration { sql, readable_from }
    }
}

/// The newest schema this binary knows.
pub fn schema_version() -> i32 {
    migrations().len() as i32
}

/// Version 1: the tables and the two functions that decide in one round trip.
const V1: &str = r#"
CREATE TABLE ephemer_hosts (
    host         text PRIMARY KEY,
    lease_until  timestamptz NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    pools        jsonb NOT NULL DEFAULT '[]',
    used         integer NOT NULL DEFAULT 0,
    capacity     integer NOT NULL DEFAULT 0,
    version      text NOT NULL DEFAULT '',
    -- What its runners' names are made of, so a survivor can find on GitHub the
    -- registrations it made and had not written here yet when it died.
    name_prefix  text NOT NULL DEFAULT '',
    install_id   text NOT NULL DEFAULT '',
    -- When a survivor last looked on GitHub for its runners (once it is dead).
    swept_at     timestamptz
);

-- One row per job any host accepted. phase: queued (nobody holds it), held (a host claims
-- it), running (GitHub said in_progress), completed.
CREATE TABLE ephemer_jobs (
    owner          text NOT NULL,
    job_id         bigint NOT NULL,
    info           jsonb NOT NULL,
    phase          text NOT NULL,
    holder         text,
    held_at        timestamptz,
    why            text NOT NULL DEFAULT '',
    attempts       integer NOT NULL DEFAULT 0,
    first_failure  bigint,
    next_attempt   bigint,
    failure_class  text,
    last_error     text,
    received_at    timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (owner, job_id)
);
CREATE INDEX ephemer_jobs_holder ON ephemer_jobs (holder) WHERE holder IS NOT NULL;
CREATE INDEX ephemer_jobs_open ON ephemer_jobs (phase) WHERE phase IN ('queued', 'held');

-- What every host must hear: job events (from any host's intake) and releases. NOTIFY only
-- wakes the listeners; they read from here, so a missed notification loses nothing.
CREATE TABLE ephemer_events (
    seq     bigserial PRIMARY KEY,
    owner   text NOT NULL,
    job_id  bigint NOT NULL,
    action  text NOT NULL,
    origin  text NOT NULL,
    body    jsonb NOT NULL,
    at      timestamptz NOT NULL DEFAULT now()
);

-- JIT registrations made, so a survivor can delete a dead host's idle runners. A row goes
-- when a survivor deleted its registration, or ten minutes after its host's environment for
-- it went (the host deletes what its runner left by then).
CREATE TABLE ephemer_registrations (
    name          text PRIMARY KEY,
    runner_id     bigint NOT NULL,
    host          text NOT NULL,
    pool          text NOT NULL,
    repo          text,
    owner         text NOT NULL,
    job_id        bigint NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- The host's environment for it is gone; its registration may still be on GitHub (not
    -- deleted yet, or never used), so the row stays until it surely is not.
    gone_at       timestamptz,
    reaping_until timestamptz
);
CREATE INDEX ephemer_registrations_host ON ephemer_registrations (host);

-- One budget per credential across the fleet: the row is locked by every claim decision, so
-- claims of one credential are decided one at a time.
CREATE TABLE ephemer_budgets (
    credential  text PRIMARY KEY,
    per_minute  integer NOT NULL
);
CREATE TABLE ephemer_claims (
    credential  text NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    host        text NOT NULL,
    owner       text NOT NULL,
    job_id      bigint NOT NULL
);
CREATE INDEX ephemer_claims_window ON ephemer_claims (credential, at);

CREATE TABLE ephemer_rates (
    credential  text NOT NULL,
    resource    text NOT NULL,
    remaining   bigint,
    lim         bigint,
    reset       bigint,
    updated     bigint NOT NULL,
    host        text NOT NULL,
    PRIMARY KEY (credential, resource)
);

-- A claim decision in one round trip. Outcomes: granted; held (detail: the live holder);
-- started (GitHub already runs or ran it); paced (wait_ms: the fleet's claim window is
-- full, or a fresh reading proves the registration budget empty until its reset).
CREATE FUNCTION ephemer_acquire(
    p_owner text, p_job bigint, p_info jsonb, p_host text, p_credential text,
    p_per_minute integer, p_fresh_secs integer
) RETURNS TABLE (outcome text, detail text, wait_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    j ephemer_jobs%ROWTYPE;
    alive boolean;
    n integer;
    oldest timestamptz;
    reset_at bigint;
    now_unix bigint := floor(extract(epoch FROM clock_timestamp()));
BEGIN
    INSERT INTO ephemer_budgets (credential, per_minute) VALUES (p_credential, p_per_minute)
        ON CONFLICT (credential) DO NOTHING;
    PERFORM 1 FROM ephemer_budgets WHERE credential = p_credential FOR UPDATE;
    INSERT INTO ephemer_jobs (owner, job_id, info, phase, why)
        VALUES (p_owner, p_job, p_info, 'queued', 'found by ' || p_host)
        ON CONFLICT (owner, job_id) DO NOTHING;
    SELECT * INTO j FROM ephemer_jobs WHERE owner = p_owner AND job_id = p_job FOR UPDATE;
    IF j.phase IN ('running', 'completed') THEN
        RETURN QUERY SELECT 'started'::text, j.phase, 0::bigint;
        RETURN;
    END IF;
    IF j.phase = 'held' AND j.holder <> p_host THEN
        SELECT h.lease_until > clock_timestamp() INTO alive
            FROM ephemer_hosts h WHERE h.host = j.holder;
        IF coalesce(alive, false) THEN
            RETURN QUERY SELECT 'held'::text, j.holder, 0::bigint;
            RETURN;
        END IF;
    END IF;
    -- 61 s, not 60: GitHub counts a claim when it arrives, some milliseconds after the grant,
    -- and a claim granted 60 s after another may arrive less than 60 s after it.
    SELECT count(*), min(c.at) INTO n, oldest FROM ephemer_claims c
        WHERE c.credential = p_credential AND c.at > clock_timestamp() - interval '61 seconds';
    IF n >= p_per_minute THEN
        RETURN QUERY SELECT 'paced'::text, 'the fleet sent max_claims_per_minute claims in the last 60 s'::text,
            greatest(1, ceil(extract(epoch FROM (oldest + interval '61 seconds' - clock_timestamp())) * 1000))::bigint;
        RETURN;
    END IF;
    SELECT r.reset INTO reset_at FROM ephemer_rates r
        WHERE r.credential = p_credential AND r.resource = 'actions_runner_registration'
          AND r.remaining = 0 AND r.reset >= now_unix AND r.updated >= now_unix - p_fresh_secs;
    IF reset_at IS NOT NULL THEN
        RETURN QUERY SELECT 'paced'::text, 'the registration budget is empty until its reset'::text,
            ((reset_at + 1 - now_unix) * 1000)::bigint;
        RETURN;
    END IF;
    UPDATE ephemer_jobs SET phase = 'held', holder = p_host, held_at = clock_timestamp(),
        why = 'claimed by ' || p_host, updated_at = clock_timestamp()
        WHERE owner = p_owner AND job_id = p_job;
    INSERT INTO ephemer_claims (credential, host, owner, job_id)
        VALUES (p_credential, p_host, p_owner, p_job);
    DELETE FROM ephemer_claims WHERE credential = p_credential
        AND at < clock_timestamp() - interval '10 minutes';
    RETURN QUERY SELECT 'granted'::text, ''::text, 0::bigint;
END $$;

-- The heartbeat's second half, run by every live host; SKIP LOCKED makes one survivor handle
-- each dead host. Releases the jobs a host whose lease expired held but had not started
-- (with their ladder, as a 'released' event every host hears) and hands back the dead host's
-- registrations to delete on GitHub (each given to one survivor for 60 s at a time).
CREATE FUNCTION ephemer_reap(p_me text)
RETURNS TABLE (name text, runner_id bigint, repo text, host text)
LANGUAGE plpgsql AS $$
DECLARE
    dead text[];
    seqs bigint;
BEGIN
    SELECT coalesce(array_agg(h.host), '{}') INTO dead FROM (
        SELECT h2.host FROM ephemer_hosts h2
        WHERE h2.lease_until < clock_timestamp() AND h2.host <> p_me
        FOR UPDATE SKIP LOCKED) h;
    WITH released AS (
        UPDATE ephemer_jobs j SET phase = 'queued', holder = NULL,
            why = 'released: the lease of ' || j.holder || ' expired',
            updated_at = clock_timestamp()
        WHERE j.phase = 'held' AND (j.holder = ANY (dead)
            OR NOT EXISTS (SELECT 1 FROM ephemer_hosts h WHERE h.host = j.holder))
        RETURNING j.*
    ), ev AS (
        INSERT INTO ephemer_events (owner, job_id, action, origin, body)
        SELECT r.owner, r.job_id, 'released', p_me, jsonb_build_object(
            'info', r.info, 'attempts', r.attempts, 'first_failure', r.first_failure,
            'next_attempt', r.next_attempt, 'class', r.failure_class, 'last_error', r.last_error)
        FROM released r
        RETURNING seq
    )
    SELECT count(*) INTO seqs FROM ev;
    IF seqs > 0 THEN
        PERFORM pg_notify('ephemer_events', '');
    END IF;
    RETURN QUERY
    UPDATE ephemer_registrations g SET reaping_until = clock_timestamp() + interval '60 seconds'
    WHERE (g.host = ANY (dead) OR NOT EXISTS (SELECT 1 FROM ephemer_hosts h WHERE h.host = g.host))
      AND (g.reaping_until IS NULL OR g.reaping_until < clock_timestamp())
    RETURNING g.name, g.runner_id, g.repo, g.host;
END $$;
"#;

/// Version 2: which host asked GitHub to redeliver which failed delivery, so the fleet asks
/// once per guid, whichever host's pass finds it first.
const V2: &str = r#"
CREATE TABLE ephemer_redeliveries (
    guid  text PRIMARY KEY,
    host  text NOT NULL,
    at    timestamptz NOT NULL DEFAULT now()
);
"#;

/// Version 3: several GitHub targets may share a fleet, and a dead host's registration is
/// deleted with its owner's credential: the reap names the owner. (`ephemer_reap` stays for
/// hosts of version 2 during a rolling upgrade.)
const V3: &str = r#"
CREATE FUNCTION ephemer_reap_owned(p_me text)
RETURNS TABLE (name text, runner_id bigint, repo text, host text, owner text)
LANGUAGE sql AS $$
    SELECT r.name, r.runner_id, r.repo, r.host, g.owner
    FROM ephemer_reap(p_me) r JOIN ephemer_registrations g ON g.name = r.name;
$$;
"#;

/// Version 4: scale-set mode's listener lease: which host holds a scale set's message session,
/// until when, its session (closed by whoever takes over from a dead holder) and the last
/// message acknowledged (where the next holder resumes).
const V4: &str = r#"
CREATE TABLE ephemer_listeners (
    scale_set        text PRIMARY KEY,
    host             text NOT NULL,
    lease_until      timestamptz NOT NULL,
    session_id       text,
    last_message_id  bigint NOT NULL DEFAULT 0
);
"#;

/// Brings the schema up to [`schema_version`], under the advisory lock. Refuses a newer one.
pub async fn migrate(client: &mut Client) -> Result<i32, LedgerError> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    let result = migrate_locked(client).await;
    let _ = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    result
}

async fn migrate_locked(client: &mut Client) -> Result<i32, LedgerError> {
    let known = schema_version();
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS ephemer_schema (version integer NOT NULL, \
             applied_at timestamptz NOT NULL DEFAULT now()); \
             ALTER TABLE ephemer_schema ADD COLUMN IF NOT EXISTS readable_from integer",
        )
        .await?;
    let row = client
        .query_one(
            "SELECT coalesce(max(version), 0), \
             coalesce(max(coalesce(readable_from, version)) FILTER (WHERE version > $1), 0) \
             FROM ephemer_schema",
            &[&known],
        )
        .await?;
    let (current, needs): (i32, i32) = (row.get(0), row.get(1));
    if current > known {
        if needs > known {
            return Err(LedgerError::SchemaTooNew {
                found: current,
                known,
                needs,
            });
        }
        tracing::warn!(
            schema = current,
            known,
            "the ledger's schema is newer than this binary, and readable by it: another host \
             runs a newer release; upgrade this one too"
        );
        return Ok(current);
    }
    for (i, m) in migrations().iter().enumerate().skip(current as usize) {
        let version = i as i32 + 1;
        let tx = client.transaction().await?;
        tx.batch_execute(m.sql).await?;
        tx.execute(
            "INSERT INTO ephemer_schema (version, readable_from) VALUES ($1, $2)",
            &[&version, &m.readable_from],
        )
        .await?;
        tx.commit().await?;
        tracing::info!(version, "ledger schema migrated");
    }
    Ok(known)
}
