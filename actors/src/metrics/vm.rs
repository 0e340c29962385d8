//! `linux_vm` pools' series, per pool (labels bounded: pools are configured). Part of the
//! daemon's `Metrics`, registered with them.

use prometheus::{HistogramOpts, HistogramVec, Registry};

use super::register;

/// The series.
#[derive(Debug, Clone)]
pub struct VmMetrics {
    /// `ephemerd_vm_boot_seconds{pool}`: QEMU started to the guest agent's hello, per VM
    /// that said it.
    pub boot: HistogramVec,
}

impl VmMetrics {
    /// The series, registered in `registry`.
    pub fn new(registry: &Registry) -> Self {
        VmMetrics {
            boot: register(
                registry,
                super::must(HistogramVec::new(
                    HistogramOpts::new(
                        "ephemerd_vm_boot_seconds",
                        "linux_vm pools: QEMU started to the guest agent's hello, per pool.",
                    )
                    .buckets(vec![
                        0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0,
                    ]),
                    &["pool"],
                )),
            ),
        }
    }
}
