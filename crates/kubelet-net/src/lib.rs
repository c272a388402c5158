//! `kubelet-net`: what every networked subsystem of the kubelet SDK shares.
//!
//! * [`http`]: the one HTTP/1 client, a `GET` as the kubelet's `httpGet` actions make it
//!   (HTTP probes, `httpGet` lifecycle hooks, the manifest URL source);
//! * [`listener`]: the bounded acceptor every listener uses (connection cap from the open-file
//!   limit, accept-error backoff, bounded drain);
//! * `tls` (feature `tls`, default): one loader of certificates, keys and CA bundles, and
//!   [`ReloadingIdentity`](tls::ReloadingIdentity), a certificate and key read from disk and
//!   read again when the files change, serving both as a server's certificate and as a client's
//!   identity, so a rotated certificate reaches listeners and clients without a restart.
//!
//! No engine and no Kubernetes client here: the engine (`kubelet-core`), the probes, the pod
//! sources and the kubelet API server use it.
#![forbid(unsafe_code)]

pub mod http;
pub mod listener;
#[cfg(feature = "tls")]
pub mod tls;
