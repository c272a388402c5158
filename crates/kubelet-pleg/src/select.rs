//! Choosing the PLEG from the kubelet's configuration: [`PlegKind`] and [`new_pleg`].

use std::sync::Arc;

use kubelet_api::{ContainerRuntime, PlegEvents, PodLifecycleEventGenerator};
use kubelet_core::configuration::KubeletConfiguration;

use crate::evented::{EventedPleg, EventedPlegConfig};
use crate::generic::{GenericPleg, GenericPlegConfig};

/// Which PLEG an agent runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PlegKind {
    /// The relist PLEG ([`GenericPleg`], every 1 s): the kubelet's default, here with
    /// `EventedPLEG=false`.
    Relist,
    /// The evented PLEG ([`EventedPleg`]): runtime events, the 300 s relist as the safety net,
    /// the 1 s relist for runtimes without events. The kubelet's `EventedPLEG` feature gate,
    /// on by default in the SDK.
    #[default]
    Evented,
}

impl PlegKind {
    /// The PLEG the configuration's feature gates ask for (`EventedPLEG`, on unless set to
    /// false).
    pub fn from_configuration(configuration: &KubeletConfiguration) -> Self {
        if configuration.feature_gate("EventedPLEG") {
            PlegKind::Evented
        } else {
            PlegKind::Relist
        }
    }
}

/// A PLEG of `kind` over `runtime`, with the kubelet's periods, and the receiver of its events.
/// Its metrics are registered by the agent's builder
/// ([`PodLifecycleEventGenerator::register_metrics`]).
pub fn new_pleg(
    kind: PlegKind,
    runtime: Arc<dyn ContainerRuntime>,
) -> (Arc<dyn PodLifecycleEventGenerator>, PlegEvents) {
    match kind {
        PlegKind::Evented => {
            tracing::info!(
                "EventedPLEG: runtime events drive the PLEG, relist every 300s as the safety net"
            );
            let (pleg, events) = EventedPleg::new(runtime, EventedPlegConfig::default());
            (Arc::new(pleg), events)
        }
        PlegKind::Relist => {
            let (pleg, events) = GenericPleg::new(runtime, GenericPlegConfig::default());
            (Arc::new(pleg), events)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_evented_pleg_is_the_default_and_the_gate_turns_it_off() {
        let mut c = KubeletConfiguration::default();
        assert_eq!(
            PlegKind::from_configuration(&c),
            PlegKind::Evented,
            "on by default"
        );
        c.feature_gates.insert("EventedPLEG".into(), true);
        assert_eq!(PlegKind::from_configuration(&c), PlegKind::Evented);
        c.feature_gates.insert("EventedPLEG".into(), false);
        assert_eq!(PlegKind::from_configuration(&c), PlegKind::Relist);
    }
}
