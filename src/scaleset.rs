//! `ephemer-actors scaleset list|delete POOL`: the scale sets of scale-set mode, which the
//! daemon creates and never deletes on a stop (a scale set's queue holds its assigned jobs).

use std::process::ExitCode;

use ephemer_actors_core::{
    config::Config,
    github::{GithubClient, actions::ActionsClient},
    metrics::Metrics,
};

/// What to do.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// List each pool's scale set: its id, labels and statistics.
    List,
    /// Delete a pool's scale set on GitHub (run it with the daemon stopped or the pool removed:
    /// a running daemon would make it again).
    Delete {
        /// The pool's name.
        pool: String,
    },
}

/// Runs `action` against every target of `config`.
pub fn run(config: &Config, action: Action) -> ExitCode {
    actix_rt::System::new().block_on(async {
        let mut failed = false;
        for target in config.targets() {
            let client = GithubClient::new(&target.github, Metrics::new(), None);
            let actions = ActionsClient::new(client);
            let gh = &target.github;
            let group = match actions
                .runner_group_id(gh.runner_group.as_deref(), gh.runner_group_id)
                .await
            {
                Ok(g) => g,
                Err(e) => {
                    eprintln!("{}: cannot reach the Actions service: {e}", target.name);
                    failed = true;
                    continue;
                }
            };
            let pools: Vec<String> = match &action {
                Action::List => config
                    .providers
                    .enabled()
                    .iter()
                    .map(|p| p.name.to_string())
                    .collect(),
                Action::Delete { pool } => vec![pool.clone()],
            };
            for pool in pools {
                match actions.find_scale_set(group, &pool).await {
                    Ok(None) => {
                        println!("{}: {pool}: no scale set", target.name);
                    }
                    Ok(Some(set)) => match &action {
                        Action::List => {
                            let s = set.statistics.unwrap_or_default();
                            println!(
                                "{}: {pool}: id {}, labels {:?}, assigned {}, running {}, runners {}",
                                target.name,
                                set.id,
                                set.label_names(),
                                s.total_assigned_jobs,
                                s.total_running_jobs,
                                s.total_registered_runners
                            );
                        }
                        Action::Delete { .. } => match actions.delete_scale_set(set.id).await {
                            Ok(()) => println!("{}: {pool}: scale set {} deleted", target.name, set.id),
                            Err(e) => {
                                eprintln!("{}: {pool}: cannot delete scale set {}: {e}", target.name, set.id);
                                failed = true;
                            }
                        },
                    },
                    Err(e) => {
                        eprintln!("{}: {pool}: cannot look it up: {e}", target.name);
                        failed = true;
                    }
                }
            }
        }
        if failed {
            ExitCode::from(crate::cli::EXIT_RUNTIME)
        } else {
            ExitCode::SUCCESS
        }
    })
}
