//! Integration tests of the daemon as a whole: the real binary, its CLI and its listeners, in
//! one test binary. The pure cores are tested in their own modules (`decide/src`), the source
//! tree's rules in `decide/tests/tidy.rs`.
//!
//! # The catalogue
//!
//! - `support/` starts the real `ephemer-actors` binary and talks to its listeners;
//! - `cli.rs` pins the CLI contract (check-config exit codes and messages, serve's lifecycle on
//!   `config/minimal.toml`);
//! - `github.rs` drives the GitHub client, App auth and rate tracking against the stand-in;
//! - `provision.rs` runs the real provisioners: a local process (JIT config in the environment,
//!   never in `/proc/<pid>/cmdline`; process trees killed on teardown and `job_timeout`, a double
//!   fork out of the group too; stale pid files never signal), and `tart.rs` runs tart with a
//!   stand-in `tart` that records the call sequence (and a real `sshd` that poses as a sibling VM
//!   holding the image's key);
//! - `container.rs` runs a Podman container (a private `podman system service` on a temp socket,
//!   started by `support/podman.rs`, with an image built from busybox-static) and its limits (a
//!   memory hog OOM-killed inside the container, a flood of output capped in the log).
//! - `admin.rs`, `intake.rs` and `security.rs` pin the admin API's access rules, the intake's
//!   limits before the body is read, and that a process of the daemon's own user cannot read its
//!   environment.
//! - `install.rs` runs four concurrent jobs from one stand-in install with `runner_dir` (as the
//!   daemon's user and, via sudo, as `nobody`): each keeps its own identity, the install is
//!   unchanged to the mtime, no copy is left. `e2e.rs` and `fungible.rs` start the real `serve`
//!   binary (`support/daemon.rs`) against the stand-in: 20 jobs and 20 claims, triple deliveries,
//!   a 502 healed by the ladder, a rate-limit window waited out, SIGTERM draining a running job,
//!   jobs in Podman containers, a runner crashing at boot, a job cancelled before pickup, a lost
//!   delivery caught by the reconcile.
//! - `durable.rs` kills the daemon with `kill -9` and starts it again: parked retries still run
//!   after the reset, running local and Podman runners are adopted and cleaned up.
//! - `reliability.rs`: a restart next to another host with the same prefix deletes only its own
//!   leftovers (registrations and environments), 20 deliveries during 5 s of an unwritable store
//!   are accepted and run, each core actor made to panic is noticed within 2 s, a second SIGTERM
//!   ends the drain.
//! - `chaos.rs` (ignored by default; `.ci/run` runs it with 1,000 jobs) runs jobs over two label
//!   sets through an embedded instance under every kind of fault at random moments (a backlog wave
//!   among them), and counts jobs lost, extra claims, runners and registrations left.
//! - `backlog.rs` runs the real binary against a stand-in that hands out the oldest queued job
//!   first, under a backlog with a share of every claim and deletion failing and a `kill -9`
//!   (three seeds in CI, ten ignored).
//! - `package.rs` (ignored; `.ci/run` builds the `.deb` and runs it) installs the package with
//!   `dpkg -i`, fills in its config as its comments say, runs `ExecStartPre` and `ExecStart` under
//!   the unit's own sandbox (every `[Service]` key applied or listed as not reproducible; an
//!   unknown one fails it), runs four jobs on the two `run_as` users, drains, and removes and
//!   purges the package.
//! - `jobdir.rs` swaps a job tree's directories for symlinks as `nobody` in a loop while root
//!   builds 300 trees;
//! - `leftovers.rs` has a job leave a process, a crontab entry, temp, lock and home files, a
//!   message queue and IPC that the next job on its uid must not see; `shared_users.rs` has two
//!   pools list the same `run_as` users under a burst with warm claims, and no user serve two
//!   jobs at once.
//! - `network.rs`: every GitHub call through a test `CONNECT` proxy (`support/proxy.rs`; the API
//!   host resolves only there), `NO_PROXY` honoured, a stand-in over TLS trusted only with
//!   `ca_file`, and what a runner's environment holds (and nothing else).
//! - `fleet.rs` (Podman): two linux pools with images the test builds beside the local table, each
//!   job in the pool its labels fit; a named volume kept between jobs and a tmpfs not; a missing
//!   image pulled once for three concurrent jobs from a registry the test serves
//!   (`support/registry.rs`), and `pull = "never"` failing its job at once.
//! - `doctor.rs`: a sound setup all ok, and a wrong token, a missing scope, a hook of another
//!   content type or without a secret, no hook at all, a `runner_dir` that is no install and a
//!   container image that is nowhere each a fail line with its fix.
//! - `systemd.rs`: `READY=1`, and `STOPPING`, `STATUS` and renewed `EXTEND_TIMEOUT_USEC` during a
//!   drain, on a stub `NOTIFY_SOCKET`.
//! - `targets.rs` runs one daemon for two owners, each behind its own stand-in GitHub (its own
//!   token, budget and hook secret): both owners' jobs run, A's empty registration budget holds
//!   back only A's claims, a delivery signed with A's secret that names B is refused 401, and a
//!   burst of 20 jobs from A does not keep B's first job from the first free slot;
//! - `hostile/` (ignored; `.ci/run` runs it): the hostile-job corpus, each attack against a
//!   weakened daemon (it must get through) and the real one (it must not), in a table;
//!   `support/netns.rs` makes the test hosts (a stand-in "internet", a metadata service) in
//!   network namespaces of the test's own.
//! - `egress.rs`: a job's network namespace attacked from inside it (as any kind's job): the
//!   allow-list's names answered and reached, other names refused through any resolver, an
//!   address no allowed name gave refused, the metadata service and this host out of reach, a
//!   pin run out; audit mode refusing nothing and reporting it.
//! - `linux_vm.rs`: `linux_vm` pools, each job's runner in a QEMU microVM of its own (TCG),
//!   booted from an image the test builds: nothing left, no JIT config on the host, no job
//!   sees an earlier job's files; `linux_vm_faults.rs`: a cancelled job, `job_timeout`, a guest
//!   that powers itself off, a guest that never boots and `kill -9` each leave nothing.
//! - `embed.rs` runs `examples/embed/src/main.rs` as it is: an instance in a host app runs a job, shuts
//!   down with no actor left (asked through weak addresses) while the host keeps serving, and
//!   starts again on the same state; in fleet mode, no actor and no gauge-writing task is left.
//! - `cluster.rs`, `cluster_stream.rs`, `cluster_lazy.rs` and `cluster_figures.rs`: `serve`
//!   processes sharing a throwaway PostgreSQL cluster: one holder per job, a host killed
//!   mid-run, the event stream, the lazy changes that ride along a round trip, the round trips
//!   per job; `cluster_outage.rs`: the ledger stopped for 8 s with redelivery on, under a CPU
//!   hog, and every refused job runs within two redelivery intervals, for three seeds.
//! - `scaleset.rs`: scale-set mode against the stand-in's Actions service: two pools, each job
//!   on its own pool's runner with no webhook; a cancelled assignment; kill -9 and resume from
//!   the last message; a second daemon's 409; token expiry, eviction, deletion, dropped polls
//!   and bad messages; a fleet's listener killed and its lease taken; `demo --scaleset`.
//!   `scaleset_fidelity.rs` holds the daemon to the service as GitHub's own clients describe it
//!   (both message shapes, capacity, jobs withdrawn and assigned again, unreadable messages,
//!   dropped labels, a service URL that may not be followed); `scaleset_reckon.rs` to its
//!   reckoning of `totalAssignedJobs`; `scaleset_reassign.rs` to assignment windows shorter
//!   than a runner's boot; `scaleset_outage.rs` to the 2026-07-25 broker outage (minutes of
//!   500, then every scale set deleted); `scaleset_chaos.rs` runs the service at its harshest
//!   with seeds (three of each shape in CI), and `scaleset_deletion.rs` a scale set deleted
//!   as an outage begins, with windows shorter than a boot and a `kill -9` (three seeds too).
//! - `pull.rs` and `redeliver.rs`: pull mode's conditional polls, and push mode's redelivery of
//!   failed deliveries (once per delivery across a fleet).
//! - `pools.rs`, `groups.rs` and `ops.rs`: pools that are down claim nothing, runner groups, and
//!   the operator's `status`/`jobs` views of a job's timeline.
//! - `runner_update.rs` and `runner_images.rs`: managed runner installs kept current from the
//!   stand-in's releases (a bad digest refused), and container images' runner versions.
//! - `docs.rs`: the README's commands, the example config, the metric names and the module edges
//!   in ARCHITECTURE.md match the code.
//! - `soak.rs`: the real daemon through thousands of jobs under faults and `kill -9`, failing on
//!   any series (RSS, fds, threads, store, every in-memory collection) that grows.
//! - `upgrade.rs`: a binary swap mid-burst both ways, a fleet upgraded one host at a time, a
//!   store an earlier build wrote.
//! - `warm.rs`, `tart_warm.rs` and `warm_registered.rs`: warm pools, booted (a process pool's
//!   directories, containers, tart VMs) and registered (idle JIT runners taking jobs at once,
//!   rotated after `warm_max_age`, none left after a drain); `warm_figures.rs` (ignored, by
//!   hand) measures them for docs/benchmarks.md.
//! - `status_page.rs` loads the status page in a real headless browser and keeps screenshots.
//! - `status_page_live.rs`: job names shown as text, the job list's filters, live updates
//!   (on the event stream, and in a page a browser keeps open, driven over the DevTools
//!   protocol by `support/cdp.rs`).
//! - `macos.rs`: what a Mac operator installs, short of the link: the release archive's recipe
//!   (`contrib/macos/make-archive` with this binary), the launchd plist read as XML, the Mac
//!   config through check-config. `tart.rs` checks every `tart` call against tart's own options.
//! - `usage.rs`: `usage` per repo and pool from the durable records, over a restart.
//! - `traces.rs`: one OpenTelemetry trace per job at a test OTLP collector
//!   (`support/otlp.rs`), through a retried claim, a `kill -9` and a binary swap.
//! - `targets_fleet.rs` does the same through a PostgreSQL fleet (each owner's budget row) and has
//!   a dead host's registrations deleted with their owner's credential.

mod admin;
mod backlog;
mod chaos;
mod cli;
mod cluster;
mod cluster_figures;
mod cluster_lazy;
mod cluster_outage;
mod cluster_stream;
mod container;
mod docs;
mod doctor;
mod durable;
mod e2e;
#[cfg(target_os = "linux")]
mod egress;
mod embed;
mod fleet;
mod fungible;
mod github;
mod groups;
mod hostile;
mod install;
mod intake;
mod jobdir;
mod leftovers;
#[cfg(target_os = "linux")]
mod linux_vm;
#[cfg(target_os = "linux")]
mod linux_vm_faults;
mod macos;
mod network;
mod ops;
mod package;
mod pools;
mod provision;
mod pull;
mod redeliver;
mod reliability;
mod runner_images;
mod runner_update;
mod scaleset;
mod scaleset_chaos;
mod scaleset_deletion;
mod scaleset_fidelity;
mod scaleset_outage;
mod scaleset_reassign;
mod scaleset_reckon;
mod security;
mod shared_users;
mod soak;
mod status_page;
mod status_page_live;
mod support;
mod systemd;
mod targets;
mod targets_fleet;
mod tart;
mod tart_warm;
mod traces;
mod upgrade;
mod usage;
mod warm;
mod warm_figures;
mod warm_registered;
