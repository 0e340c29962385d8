//! `Stop`: the one message that ends an actor of an instance. Every actor answers it by
//! stopping its context, which ends its timers and spawned work with it; a parent that stops
//! sends it on to the children it owns. `Handles::shutdown` sends it, in order, after a drain.

use actix::Message;

/// Stop this actor (and the children it owns) now.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Stop;

/// Implements `Handler<Stop>` for actors whose stop needs nothing more than `ctx.stop()`.
#[macro_export]
#[doc(hidden)]
macro_rules! stop_on_request {
    ($($actor:ty),+ $(,)?) => {$(
        impl actix::Handler<$crate::lifecycle::Stop> for $actor {
            type Result = ();

            fn handle(&mut self, _: $crate::lifecycle::Stop, ctx: &mut Self::Context) {
                actix::ActorContext::stop(ctx);
            }
        }

        impl actix::Handler<$crate::lifecycle::Crash> for $actor {
            type Result = ();

            fn handle(&mut self, _: $crate::lifecycle::Crash, _: &mut Self::Context) {
                panic!("{} crashed on request (a fault test)", stringify!($actor));
            }
        }
    )+};
}

/// Makes an actor panic, as a bug would: for fault tests of the instance's supervision.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, actix::Message)]
#[rtype(result = "()")]
pub struct Crash;

/// Makes a supervisor's provisioner panic (the supervisor itself carries on and applies its
/// restart policy): for fault tests and chaos runs.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, actix::Message)]
#[rtype(result = "()")]
pub struct CrashProvisioner;
