//! Watched objects decoded by one deserializer: [`Decoded`].
//!
//! `kube`'s watch decodes each event line as an adjacently tagged enum. Its generated code
//! decodes the object directly when `type` comes first and through a buffered copy when
//! `object` does, so every watched type (and every type inside it: a `Pod` holds about two
//! hundred) was compiled twice more besides the decoding of `get`/`create`/`patch` answers,
//! about a quarter of a megabyte for pods alone. [`Decoded`] takes the object's JSON text and
//! decodes it with the same deserializer as those answers, so each type is compiled once.
//!
//! The object's text comes from `serde_json`'s raw-value protocol (a newtype named by its token,
//! answered with the text); a deserializer that does not speak it (the buffered copy of an event
//! whose `object` precedes its `type`, which the API server never writes) hands over the value,
//! which is written back to text first. So a change in that protocol costs speed, never a wrong
//! object.

use std::borrow::Cow;
use std::marker::PhantomData;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use kube::Resource;
use kube::api::ObjectMeta;
use serde::de::{DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// A `K` read from the JSON text of a list item or a watch event's object. It is the resource
/// `K` for `kube` (same kind, group, version and metadata), so an `Api<Decoded<K>>` lists and
/// watches `K`s.
#[derive(Clone, Debug)]
pub(crate) struct Decoded<K>(pub(crate) K);

/// How a type is decoded from and encoded to JSON text: through one function per type, so that
/// its code is compiled once in a binary whichever crate uses it (a `Pod` through
/// [`kubelet_api::pod::from_json`] and [`kubelet_api::pod::to_json`], which the manifest
/// sources and the kubelet API use too).
pub(crate) trait JsonText: Sized {
    /// Decode `text`.
    fn from_json_text(text: &str) -> Result<Self, serde_json::Error>;
    /// Encode `self`.
    fn to_json_text(&self) -> Result<String, serde_json::Error>;
}

impl JsonText for Pod {
    fn from_json_text(text: &str) -> Result<Self, serde_json::Error> {
        kubelet_api::pod::from_json(text)
    }
    fn to_json_text(&self) -> Result<String, serde_json::Error> {
        String::from_utf8(kubelet_api::pod::to_json(self)).map_err(serde::ser::Error::custom)
    }
}

macro_rules! json_text {
    ($($t:ty),*) => {$(
        impl JsonText for $t {
            fn from_json_text(text: &str) -> Result<Self, serde_json::Error> {
                serde_json::from_str(text)
            }
            fn to_json_text(&self) -> Result<String, serde_json::Error> {
                serde_json::to_string(self)
            }
        }
    )*};
}
json_text!(ConfigMap, Secret, Service);

/// The name `serde_json` gives the newtype whose deserialization hands over the JSON text.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

impl<'de, K: JsonText> Deserialize<'de> for Decoded<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_newtype_struct(RAW_VALUE_TOKEN, TextVisitor(PhantomData))
    }
}

/// Decodes a `K` from the JSON text the raw-value protocol hands over, or from a value.
struct TextVisitor<K>(PhantomData<K>);

impl<'de, K: JsonText> Visitor<'de> for TextVisitor<K> {
    type Value = Decoded<K>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    /// `serde_json`'s raw-value protocol: one entry, whose value is the text.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        if map.next_key::<IgnoredAny>()?.is_none() {
            return Err(A::Error::custom("an empty raw value"));
        }
        map.next_value_seed(self)
    }

    /// Any other deserializer: the value, written back to text.
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        self.visit_str(&value.to_string())
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Self::Value, E> {
        K::from_json_text(text).map(Decoded).map_err(E::custom)
    }
}

impl<'de, K: JsonText> DeserializeSeed<'de> for TextVisitor<K> {
    type Value = Decoded<K>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

/// Encoded through [`JsonText`] and handed to the serializer as raw JSON text.
impl<K: JsonText> Serialize for Decoded<K> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error as _;
        let text = self.0.to_json_text().map_err(S::Error::custom)?;
        let raw = RawValue::from_string(text).map_err(S::Error::custom)?;
        raw.serialize(serializer)
    }
}

impl<K: Resource> Resource for Decoded<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn metadata_api() -> bool {
        K::metadata_api()
    }
    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0.meta_mut()
    }
}

/// The watcher event of `Decoded<K>` as one of `K`.
pub(crate) fn event<K>(
    event: kube::runtime::watcher::Event<Decoded<K>>,
) -> kube::runtime::watcher::Event<K> {
    use kube::runtime::watcher::Event;
    match event {
        Event::Apply(o) => Event::Apply(o.0),
        Event::Delete(o) => Event::Delete(o.0),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(o.0),
        Event::InitDone => Event::InitDone,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kube::core::ObjectList;
    use kube::core::WatchEvent;

    const POD: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ns","resourceVersion":"7"},"spec":{"containers":[{"name":"c","image":"busybox"}],"volumes":[{"name":"v","emptyDir":{}}]}}"#;

    #[test]
    fn watch_events_and_lists_decode_as_the_resource() {
        let line = format!(r#"{{"type":"MODIFIED","object":{POD}}}"#);
        let event: WatchEvent<Decoded<Pod>> = serde_json::from_str(&line).unwrap();
        let WatchEvent::Modified(Decoded(pod)) = event else {
            panic!("not MODIFIED")
        };
        assert_eq!(pod.metadata.name.as_deref(), Some("p"));
        assert_eq!(pod.spec.unwrap().volumes.unwrap()[0].name, "v");

        let list = format!(
            r#"{{"apiVersion":"v1","kind":"PodList","metadata":{{"resourceVersion":"9"}},"items":[{POD},{POD}]}}"#
        );
        let list: ObjectList<Decoded<Pod>> = serde_json::from_str(&list).unwrap();
        assert_eq!(list.items.len(), 2);
        assert_eq!(list.items[1].meta().resource_version.as_deref(), Some("7"));
        assert_eq!(<Decoded<Pod> as Resource>::plural(&()), "pods");
        assert_eq!(
            <Decoded<Pod> as Resource>::url_path(&(), Some("ns")),
            "/api/v1/namespaces/ns/pods"
        );
    }

    #[test]
    fn an_event_whose_object_comes_first_decodes_through_the_value() {
        let reversed = format!(r#"{{"object":{POD},"type":"ADDED"}}"#);
        let event: WatchEvent<Decoded<Pod>> = serde_json::from_str(&reversed).unwrap();
        let WatchEvent::Added(Decoded(pod)) = event else {
            panic!("not ADDED")
        };
        assert_eq!(
            pod.spec.unwrap().containers[0].image.as_deref(),
            Some("busybox")
        );
        let from_value: Decoded<Pod> =
            serde_json::from_value(serde_json::from_str(POD).unwrap()).unwrap();
        assert_eq!(from_value.0.metadata.namespace.as_deref(), Some("ns"));
    }

    #[test]
    fn an_object_is_sent_as_its_json_text() {
        let pod: Pod = serde_json::from_str(POD).unwrap();
        let sent = serde_json::to_vec(&Decoded(pod.clone())).unwrap();
        assert_eq!(sent, serde_json::to_vec(&pod).unwrap());
    }

    #[test]
    fn a_bad_object_is_an_error_not_a_panic() {
        let line = r#"{"type":"ADDED","object":{"metadata":{"name":3}}}"#;
        assert!(serde_json::from_str::<WatchEvent<Decoded<Pod>>>(line).is_err());
    }
}
