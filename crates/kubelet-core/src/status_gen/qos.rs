//! The pod's QoS class (`GetPodQOS`): [`kubelet_api::resources::qos_class`].

pub use kubelet_api::resources::{QosClass, qos_class};
