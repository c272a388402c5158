//! The engine's side of plugins: their states, and the text of a panic.

use std::sync::Arc;

use kubelet_api::{PluginState, PluginStatus};
use parking_lot::Mutex;

/// The plugins' states, shared between the agent and its handles.
#[derive(Clone, Default)]
pub(crate) struct PluginStates(Arc<Mutex<Vec<PluginStatus>>>);

impl PluginStates {
    pub(crate) fn new(names: impl IntoIterator<Item = String>) -> Self {
        Self(Arc::new(Mutex::new(
            names
                .into_iter()
                .map(|name| PluginStatus {
                    name,
                    state: PluginState::Registered,
                })
                .collect(),
        )))
    }

    pub(crate) fn set(&self, index: usize, state: PluginState) {
        if let Some(s) = self.0.lock().get_mut(index) {
            s.state = state;
        }
    }

    pub(crate) fn list(&self) -> Vec<PluginStatus> {
        self.0.lock().clone()
    }
}

/// The text of a panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}
