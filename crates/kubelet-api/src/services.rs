//! Services plugins share: one plugin provides a typed service at build, others take it from
//! their [`PluginContext`](crate::PluginContext).
//!
//! A service is an `Arc<T>` keyed by its type `T`, usually a trait object
//! (`Arc<dyn StatsService>`): the stats plugin provides it, the kubelet server and eviction
//! read it. Rules:
//!
//! * **Provided once.** [`AgentPlugin::provide_services`](crate::AgentPlugin::provide_services)
//!   is called at the engine's build, in registration order; a second provider of the same type
//!   is a build error naming both plugins ([`ServiceConflict`]).
//! * **Missing is normal.** [`Services::get`] returns `None` when no plugin provides `T`; a
//!   consumer then does without (the server answers 404 on the stats paths, eviction reads the
//!   machine itself), and says so once in its log.
//! * **Read-only after build.** The set is frozen when the agent is assembled; a plugin that
//!   needs a service calls [`PluginContext::service`](crate::PluginContext::service) from its
//!   `run` (or keeps the `Arc` it gets there).
//!
//! ```
//! use std::sync::Arc;
//! use kubelet_api::Services;
//!
//! trait Clock: Send + Sync { fn now(&self) -> u64; }
//! struct Fixed;
//! impl Clock for Fixed { fn now(&self) -> u64 { 7 } }
//!
//! let mut services = Services::default();
//! services.provide::<dyn Clock>("clock-plugin", Arc::new(Fixed)).unwrap();
//! assert_eq!(services.get::<dyn Clock>().unwrap().now(), 7);
//! assert!(services.get::<String>().is_none());
//! ```

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

/// Two plugins provide the same service.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("service {service} is provided by plugin {first:?} and again by plugin {second:?}")]
pub struct ServiceConflict {
    /// The service's type name.
    pub service: &'static str,
    /// The plugin that provided it first.
    pub first: String,
    /// The plugin that provided it again.
    pub second: String,
}

struct Entry {
    provider: String,
    value: Box<dyn Any + Send + Sync>,
}

/// The services of one agent, keyed by type. Cheap to clone once frozen behind an `Arc` (the
/// engine does that at build).
#[derive(Default)]
pub struct Services {
    entries: HashMap<TypeId, Entry>,
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.entries.values().map(|e| &e.provider))
            .finish()
    }
}

impl Services {
    /// Provide `service` as the agent's `T`, on behalf of plugin `provider`.
    pub fn provide<T: ?Sized + Send + Sync + 'static>(
        &mut self,
        provider: &str,
        service: Arc<T>,
    ) -> Result<(), ServiceConflict> {
        let key = TypeId::of::<Arc<T>>();
        if let Some(e) = self.entries.get(&key) {
            return Err(ServiceConflict {
                service: std::any::type_name::<T>(),
                first: e.provider.clone(),
                second: provider.to_string(),
            });
        }
        self.entries.insert(
            key,
            Entry {
                provider: provider.to_string(),
                value: Box::new(service),
            },
        );
        Ok(())
    }

    /// The agent's `T`, if a plugin provides one.
    pub fn get<T: ?Sized + Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        self.entries
            .get(&TypeId::of::<Arc<T>>())
            .and_then(|e| e.value.downcast_ref::<Arc<T>>())
            .cloned()
    }

    /// The name of the plugin that provides `T`.
    pub fn provider<T: ?Sized + Send + Sync + 'static>(&self) -> Option<&str> {
        self.entries
            .get(&TypeId::of::<Arc<T>>())
            .map(|e| e.provider.as_str())
    }

    /// How many services are provided.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no plugin provides a service.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    trait Greeter: Send + Sync {
        fn hello(&self) -> &'static str;
    }
    struct En;
    impl Greeter for En {
        fn hello(&self) -> &'static str {
            "hello"
        }
    }

    #[test]
    fn a_service_is_found_by_its_type_and_a_second_provider_is_refused() {
        let mut s = Services::default();
        assert!(s.get::<dyn Greeter>().is_none());
        s.provide::<dyn Greeter>("a", Arc::new(En)).unwrap();
        s.provide::<u32>("b", Arc::new(7)).unwrap();
        assert_eq!(s.get::<dyn Greeter>().map(|g| g.hello()), Some("hello"));
        assert_eq!(s.get::<u32>().as_deref(), Some(&7));
        assert_eq!(s.provider::<dyn Greeter>(), Some("a"));
        let err = s.provide::<dyn Greeter>("c", Arc::new(En)).unwrap_err();
        assert_eq!(err.first, "a");
        assert_eq!(err.second, "c");
        assert!(err.to_string().contains("Greeter"), "{err}");
        // The refused provider did not replace the first.
        assert_eq!(s.provider::<dyn Greeter>(), Some("a"));
        assert_eq!(s.len(), 2);
    }
}
