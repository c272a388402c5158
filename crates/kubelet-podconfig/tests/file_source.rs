//! The file source through the merge, on a real filesystem with real inotify.
//!
//! The periodic re-list is set to 60 s in most tests, so anything arriving within a few seconds
//! proves the watch works.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kubelet_api::{Event, EventRecorder, EventType, PodOp, PodUpdate, annotations};
use kubelet_core::merge::PodConfig;
use kubelet_podconfig::{FileSource, FileSourceConfig};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const NODE: &str = "Node1";
/// Well under the kubelet's 20 s period, but generous for a busy machine.
const ARRIVAL: Duration = Duration::from_secs(5);
/// How long to watch for (unwanted) further updates.
const QUIET: Duration = Duration::from_millis(1500);

fn manifest(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: app\n    image: {image}\n    command: [sleep, \"3600\"]\n"
    )
}

struct Harness {
    updates: mpsc::Receiver<PodUpdate>,
    events: mpsc::Receiver<Event>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Harness {
    fn start(path: &Path, check: Duration) -> Self {
        Self::start_with_events(path, check, 100)
    }

    /// [`Harness::start`] with room for `events` events.
    fn start_with_events(path: &Path, check: Duration, events: usize) -> Self {
        let (recorder, events) = EventRecorder::channel(events);
        let mut config = PodConfig::new(recorder);
        let source = FileSource::new(path, NODE)
            .with_config(FileSourceConfig::default().check_frequency(check));
        config.add_source(Arc::new(source)).expect("one source");
        let shutdown = CancellationToken::new();
        let (updates, run) = config.start(shutdown.clone());
        let task = tokio::spawn(run);
        Self {
            updates,
            events,
            shutdown,
            task,
        }
    }

    async fn next(&mut self) -> PodUpdate {
        tokio::time::timeout(ARRIVAL, self.updates.recv())
            .await
            .expect("an update within 5 s")
            .expect("update channel open")
    }

    /// Updates until none came for `QUIET`.
    async fn drain(&mut self) -> Vec<PodUpdate> {
        let mut out = Vec::new();
        while let Ok(Some(u)) = tokio::time::timeout(QUIET, self.updates.recv()).await {
            out.push(u);
        }
        out
    }

    async fn next_event(&mut self) -> Event {
        tokio::time::timeout(ARRIVAL, self.events.recv())
            .await
            .expect("an event within 5 s")
            .expect("event channel open")
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("pod config stops")
            .expect("no panic");
    }
}

fn uids(u: &PodUpdate) -> Vec<String> {
    u.pods
        .iter()
        .map(|p| p.metadata.uid.clone().unwrap_or_default())
        .collect()
}

fn summary(updates: &[PodUpdate]) -> Vec<(PodOp, usize)> {
    updates.iter().map(|u| (u.op, u.pods.len())).collect()
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write manifest");
}

#[tokio::test]
async fn empty_directory_gives_an_empty_first_add() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::start(dir.path(), Duration::from_secs(60));
    let first = h.next().await;
    assert_eq!((first.op, first.pods.len()), (PodOp::Add, 0));
    assert_eq!(first.source, "file");
    assert!(h.drain().await.is_empty());
    h.stop().await;
}

#[tokio::test]
async fn missing_directory_gives_an_empty_first_add_and_is_picked_up_once_created() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("manifests");
    let mut h = Harness::start(&path, Duration::from_secs(60));
    let first = h.next().await;
    assert_eq!((first.op, first.pods.len()), (PodOp::Add, 0));
    std::fs::create_dir(&path).expect("mkdir");
    write(&path.join("web.yaml"), &manifest("web", "busybox"));
    let add = h.next().await;
    assert_eq!((add.op, add.pods.len()), (PodOp::Add, 1));
    h.stop().await;
}

#[tokio::test]
async fn dropped_manifest_arrives_as_add_long_before_the_periodic_relist() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::start(dir.path(), Duration::from_secs(60));
    assert_eq!(h.next().await.pods.len(), 0);

    let started = std::time::Instant::now();
    let path = dir.path().join("web.yaml");
    write(&path, &manifest("web", "busybox"));
    let add = h.next().await;
    assert!(started.elapsed() < ARRIVAL);
    assert_eq!(add.op, PodOp::Add);
    assert_eq!(add.pods.len(), 1);
    let pod = &add.pods[0];
    assert_eq!(pod.metadata.name.as_deref(), Some("web-node1"));
    assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
    let ann = pod.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        ann.get(annotations::CONFIG_SOURCE).map(String::as_str),
        Some("file")
    );
    assert!(ann.contains_key(annotations::CONFIG_SEEN));
    assert_eq!(ann.get(annotations::CONFIG_HASH), pod.metadata.uid.as_ref());
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(NODE)
    );
    assert!(h.drain().await.is_empty(), "exactly one update");
    h.stop().await;
}

#[tokio::test]
async fn editing_a_manifest_replaces_the_pod() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("web.yaml");
    write(&path, &manifest("web", "busybox"));
    let mut h = Harness::start(dir.path(), Duration::from_secs(60));
    let add = h.next().await;
    assert_eq!(add.op, PodOp::Add);
    let old = uids(&add);

    write(&path, &manifest("web", "nginx"));
    let updates = h.drain().await;
    assert_eq!(
        summary(&updates),
        vec![(PodOp::Remove, 1), (PodOp::Add, 1)],
        "{updates:#?}"
    );
    assert_eq!(uids(&updates[0]), old);
    assert_ne!(uids(&updates[1]), old);
    assert_eq!(
        updates[1].pods[0]
            .spec
            .as_ref()
            .and_then(|s| s.containers[0].image.as_deref()),
        Some("nginx")
    );
    h.stop().await;
}

#[tokio::test]
async fn atomic_rename_save_yields_exactly_one_pod() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::start(dir.path(), Duration::from_secs(60));
    assert_eq!(h.next().await.pods.len(), 0);

    let tmp = dir.path().join(".web.yaml.tmp");
    let path = dir.path().join("web.yaml");
    write(&tmp, &manifest("web", "busybox"));
    std::fs::rename(&tmp, &path).expect("rename");
    let updates = h.drain().await;
    assert_eq!(summary(&updates), vec![(PodOp::Add, 1)], "{updates:#?}");
    let first = uids(&updates[0]);

    // Saving an edit the same way replaces the pod once.
    write(&tmp, &manifest("web", "nginx"));
    std::fs::rename(&tmp, &path).expect("rename");
    let updates = h.drain().await;
    assert_eq!(
        summary(&updates),
        vec![(PodOp::Remove, 1), (PodOp::Add, 1)],
        "{updates:#?}"
    );
    assert_eq!(uids(&updates[0]), first);
    assert!(h.events.try_recv().is_err(), "no validation events");
    h.stop().await;
}

#[tokio::test]
async fn a_file_written_in_two_chunks_yields_one_pod() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::start(dir.path(), Duration::from_secs(60));
    assert_eq!(h.next().await.pods.len(), 0);

    let text = manifest("web", "busybox");
    let (a, b) = text.split_at(text.len() / 2);
    let mut f = std::fs::File::create(dir.path().join("web.yaml")).expect("create");
    f.write_all(a.as_bytes()).expect("first chunk");
    f.flush().expect("flush");
    // Longer than the debounce: only the open-for-writing tracking keeps the half file unread.
    tokio::time::sleep(Duration::from_millis(400)).await;
    f.write_all(b.as_bytes()).expect("second chunk");
    drop(f);

    let updates = h.drain().await;
    assert_eq!(summary(&updates), vec![(PodOp::Add, 1)], "{updates:#?}");
    assert!(
        h.events.try_recv().is_err(),
        "the half-written file was never reported"
    );
    h.stop().await;
}

#[tokio::test]
async fn deleting_a_manifest_removes_its_pod() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("web.yaml");
    write(&path, &manifest("web", "busybox"));
    write(&dir.path().join("db.yaml"), &manifest("db", "busybox"));
    let mut h = Harness::start(dir.path(), Duration::from_secs(60));
    let add = h.next().await;
    assert_eq!((add.op, add.pods.len()), (PodOp::Add, 2));
    let web_uid = add
        .pods
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("web-node1"))
        .and_then(|p| p.metadata.uid.clone())
        .expect("web pod");

    std::fs::remove_file(&path).expect("rm");
    let updates = h.drain().await;
    assert_eq!(summary(&updates), vec![(PodOp::Remove, 1)]);
    assert_eq!(uids(&updates[0]), vec![web_uid]);
    h.stop().await;
}

#[tokio::test]
async fn dot_files_are_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        &dir.path().join(".hidden.yaml"),
        &manifest("hidden", "busybox"),
    );
    let mut h = Harness::start(dir.path(), Duration::from_secs(60));
    assert_eq!(h.next().await.pods.len(), 0);
    write(&dir.path().join(".swap.yaml"), &manifest("swap", "busybox"));
    assert!(h.drain().await.is_empty());
    h.stop().await;
}

#[tokio::test]
async fn subdirectories_are_not_recursed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).expect("mkdir");
    write(&sub.join("inner.yaml"), &manifest("inner", "busybox"));
    write(&dir.path().join("web.yaml"), &manifest("web", "busybox"));
    let mut h = Harness::start(dir.path(), Duration::from_secs(60));
    let add = h.next().await;
    assert_eq!((add.op, add.pods.len()), (PodOp::Add, 1));
    assert!(h.events.try_recv().is_err());
    h.stop().await;
}

#[tokio::test]
async fn a_single_manifest_file_can_be_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("web.yaml");
    write(&path, &manifest("web", "busybox"));
    write(
        &dir.path().join("other.yaml"),
        &manifest("other", "busybox"),
    );
    let mut h = Harness::start(&path, Duration::from_secs(60));
    let add = h.next().await;
    assert_eq!((add.op, add.pods.len()), (PodOp::Add, 1));
    // Changes to other files in the directory do not matter; the file itself does.
    write(&dir.path().join("other.yaml"), &manifest("other", "nginx"));
    assert!(h.drain().await.is_empty());
    write(&path, &manifest("web", "nginx"));
    assert_eq!(
        summary(&h.drain().await),
        vec![(PodOp::Remove, 1), (PodOp::Add, 1)]
    );
    h.stop().await;
}

/// Drop `content` into a watched directory that already runs a good pod: expect a
/// FailedValidation warning naming the file and mentioning `reason`, and no change to the
/// good pod.
async fn invalid_manifest_is_reported_and_other_pods_stay(content: Vec<u8>, reason: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    write(&dir.path().join("good.yaml"), &manifest("good", "busybox"));
    let mut h = Harness::start(dir.path(), Duration::from_secs(60));
    let add = h.next().await;
    assert_eq!((add.op, add.pods.len()), (PodOp::Add, 1));

    let bad: PathBuf = dir.path().join("bad.yaml");
    std::fs::write(&bad, &content).expect("write bad manifest");
    let ev = h.next_event().await;
    assert_eq!(ev.type_, EventType::Warning);
    assert_eq!(ev.reason, "FailedValidation");
    assert!(
        ev.message.contains(&bad.display().to_string()),
        "event names the file: {}",
        ev.message
    );
    assert!(ev.message.contains(reason), "{}", ev.message);
    assert!(h.drain().await.is_empty(), "the good pod is untouched");

    // A good manifest written afterwards still arrives: the source kept running.
    write(&dir.path().join("late.yaml"), &manifest("late", "busybox"));
    assert_eq!(summary(&h.drain().await), vec![(PodOp::Add, 1)]);
    h.stop().await;
}

#[tokio::test]
async fn bad_yaml_is_reported_and_leaves_other_pods_in_place() {
    invalid_manifest_is_reported_and_other_pods_stay(
        b"apiVersion: v1\nkind: Pod\nmetadata: [unclosed\n".to_vec(),
        "invalid YAML",
    )
    .await;
}

#[tokio::test]
async fn missing_name_is_reported_and_leaves_other_pods_in_place() {
    invalid_manifest_is_reported_and_other_pods_stay(
        manifest("x", "busybox")
            .replace("  name: x\n", "  labels: {a: b}\n")
            .into_bytes(),
        "invalid pod: name is needed for the pod",
    )
    .await;
}

#[tokio::test]
async fn duplicate_container_names_are_reported_and_leave_other_pods_in_place() {
    let text = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: dup\nspec:\n  containers:\n  - name: app\n    image: a\n  - name: app\n    image: b\n";
    invalid_manifest_is_reported_and_other_pods_stay(
        text.as_bytes().to_vec(),
        "spec.containers[1].name: Duplicate value: \"app\"",
    )
    .await;
}

#[tokio::test]
async fn a_20_mib_manifest_is_reported_and_leaves_other_pods_in_place() {
    invalid_manifest_is_reported_and_other_pods_stay(
        vec![b'#'; 20 * 1024 * 1024],
        "exceeds the maximum size of 10485760 bytes",
    )
    .await;
}

#[tokio::test]
async fn a_pod_list_is_rejected() {
    invalid_manifest_is_reported_and_other_pods_stay(
        b"apiVersion: v1\nkind: PodList\nitems: []\n".to_vec(),
        "PodList",
    )
    .await;
}

#[tokio::test]
async fn an_invalid_manifest_at_start_is_reported_and_the_rest_still_arrives() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(&dir.path().join("a.yaml"), "not: [valid\n");
    write(&dir.path().join("b.yaml"), &manifest("b", "busybox"));
    let mut h = Harness::start(dir.path(), Duration::from_secs(60));
    let add = h.next().await;
    assert_eq!((add.op, add.pods.len()), (PodOp::Add, 1));
    let ev = h.next_event().await;
    assert!(ev.message.contains("a.yaml"), "{}", ev.message);
    h.stop().await;
}

#[tokio::test]
async fn a_broken_edit_keeps_the_old_pod_until_the_periodic_relist() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("web.yaml");
    write(&path, &manifest("web", "busybox"));
    let mut h = Harness::start(dir.path(), Duration::from_secs(3));
    let add = h.next().await;
    assert_eq!(add.op, PodOp::Add);
    let uid = uids(&add);

    write(&path, "apiVersion: v1\nkind: Pod\nmetadata: [broken\n");
    let ev = h.next_event().await;
    assert!(ev.message.contains("web.yaml"), "{}", ev.message);
    // The watch-triggered re-list kept the pod; the next periodic re-list removes it.
    let remove = tokio::time::timeout(Duration::from_secs(10), h.updates.recv())
        .await
        .expect("removed by the periodic re-list")
        .expect("channel open");
    assert_eq!(remove.op, PodOp::Remove);
    assert_eq!(uids(&remove), uid);
    // Reported once, not again at every period.
    assert!(h.events.try_recv().is_err());

    // Fixing the file brings the pod back.
    write(&path, &manifest("web", "busybox"));
    let add = h.next().await;
    assert_eq!((add.op, uids(&add)), (PodOp::Add, uid));
    h.stop().await;
}

/// The layout of a ConfigMap volume: `web.yaml -> ..data/web.yaml`, `..data -> ..<version>`,
/// and an update that swaps `..data` atomically, as the kubelet's atomic writer does.
fn configmap_version(dir: &Path, version: &str, files: &[(&str, String)]) {
    let v = dir.join(version);
    std::fs::create_dir(&v).expect("version dir");
    for (name, text) in files {
        write(&v.join(name), text);
    }
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(version, &tmp).expect("symlink");
    std::fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
    for (name, _) in files {
        let visible = dir.join(name);
        if std::fs::symlink_metadata(&visible).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &visible).expect("symlink");
        }
    }
}

#[tokio::test]
async fn configmap_style_data_swaps_yield_one_update_per_edit() {
    let dir = tempfile::tempdir().expect("tempdir");
    configmap_version(
        dir.path(),
        "..v1",
        &[("web.yaml", manifest("web", "busybox"))],
    );
    let mut h = Harness::start(dir.path(), Duration::from_secs(60));
    let updates = h.drain().await;
    assert_eq!(summary(&updates), vec![(PodOp::Add, 1)], "{updates:#?}");

    // An edit: a new version directory and an atomic swap of `..data` (all dot-names).
    configmap_version(
        dir.path(),
        "..v2",
        &[("web.yaml", manifest("web", "nginx"))],
    );
    std::fs::remove_dir_all(dir.path().join("..v1")).expect("old version");
    let updates = h.drain().await;
    assert_eq!(
        summary(&updates),
        vec![(PodOp::Remove, 1), (PodOp::Add, 1)],
        "{updates:#?}"
    );
    let image = updates[1].pods[0]
        .spec
        .as_ref()
        .and_then(|s| s.containers[0].image.clone());
    assert_eq!(image.as_deref(), Some("nginx"));

    // A new key: one more pod, the other untouched.
    configmap_version(
        dir.path(),
        "..v3",
        &[
            ("web.yaml", manifest("web", "nginx")),
            ("db.yaml", manifest("db", "postgres")),
        ],
    );
    std::fs::remove_dir_all(dir.path().join("..v2")).expect("old version");
    let updates = h.drain().await;
    assert_eq!(summary(&updates), vec![(PodOp::Add, 1)], "{updates:#?}");
    assert!(h.events.try_recv().is_err(), "no validation events");
    h.stop().await;
}

#[tokio::test]
async fn a_symlinked_manifest_directory_follows_a_repointed_link() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b) = (root.path().join("a"), root.path().join("b"));
    std::fs::create_dir(&a).expect("a");
    std::fs::create_dir(&b).expect("b");
    write(&a.join("web.yaml"), &manifest("web", "busybox"));
    write(&b.join("web.yaml"), &manifest("web", "nginx"));
    let link = root.path().join("manifests");
    std::os::unix::fs::symlink(&a, &link).expect("link");

    let mut h = Harness::start(&link, Duration::from_secs(60));
    let updates = h.drain().await;
    assert_eq!(summary(&updates), vec![(PodOp::Add, 1)], "{updates:#?}");

    // Edits behind the link are seen.
    write(&a.join("db.yaml"), &manifest("db", "postgres"));
    let updates = h.drain().await;
    assert_eq!(summary(&updates), vec![(PodOp::Add, 1)], "{updates:#?}");

    // Re-point the link atomically (as `ln -sfn` + rename): b replaces a.
    let tmp = root.path().join("manifests.tmp");
    std::os::unix::fs::symlink(&b, &tmp).expect("tmp link");
    std::fs::rename(&tmp, &link).expect("swap link");
    let updates = h.drain().await;
    assert_eq!(
        summary(&updates),
        vec![(PodOp::Remove, 2), (PodOp::Add, 1)],
        "{updates:#?}"
    );

    // And the watch now follows b.
    write(&b.join("cache.yaml"), &manifest("cache", "redis"));
    let updates = h.drain().await;
    assert_eq!(summary(&updates), vec![(PodOp::Add, 1)], "{updates:#?}");
    h.stop().await;
}

#[tokio::test]
async fn editor_backups_autosaves_and_vim_saves_never_duplicate_or_miss_a_pod() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::start(dir.path(), Duration::from_secs(60));
    assert_eq!(h.next().await.pods.len(), 0);
    let path = dir.path().join("web.yaml");
    write(&path, &manifest("web", "busybox"));
    let updates = h.drain().await;
    assert_eq!(summary(&updates), vec![(PodOp::Add, 1)], "{updates:#?}");

    // Emacs while editing: a lock symlink, an auto-save file and a backup. None is a pod.
    std::os::unix::fs::symlink("user@host.1234", dir.path().join(".#web.yaml")).expect("lock");
    write(&dir.path().join("#web.yaml#"), &manifest("web", "nginx"));
    write(&dir.path().join("web.yaml~"), &manifest("web", "busybox"));
    let updates = h.drain().await;
    assert!(updates.is_empty(), "{updates:#?}");

    // Vim's default save: probe file 4913, rename the original to a backup, write the new
    // file, delete the backup. Exactly one replacement.
    let probe = dir.path().join("4913");
    write(&probe, "");
    std::fs::remove_file(&probe).expect("probe");
    std::fs::rename(&path, dir.path().join("web.yaml~")).expect("backup");
    write(&path, &manifest("web", "nginx"));
    std::fs::remove_file(dir.path().join("web.yaml~")).expect("remove backup");
    let updates = h.drain().await;
    assert_eq!(
        summary(&updates),
        vec![(PodOp::Remove, 1), (PodOp::Add, 1)],
        "{updates:#?}"
    );
    assert!(h.events.try_recv().is_err(), "no validation events");

    // A periodic re-list sees the same set: nothing more.
    h.stop().await;
}

#[tokio::test]
async fn a_new_file_reusing_a_running_pods_name_is_ignored_with_a_warning_naming_both_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::start(dir.path(), Duration::from_secs(60));
    assert_eq!(h.next().await.pods.len(), 0);
    write(&dir.path().join("web.yaml"), &manifest("web", "nginx:1"));
    let add = h.next().await;
    assert_eq!((add.op, add.pods.len()), (PodOp::Add, 1));
    let running = uids(&add);
    // A file that sorts first and names the same pod: the running pod stays.
    write(&dir.path().join("0-copy.yaml"), &manifest("web", "nginx:2"));
    let ev = h.next_event().await;
    assert_eq!(ev.reason, "FailedValidation");
    assert!(
        ev.message.contains("0-copy.yaml") && ev.message.contains("web.yaml"),
        "{}",
        ev.message
    );
    let after = h.drain().await;
    assert!(
        after
            .iter()
            .all(|u| u.op != PodOp::Remove && u.op != PodOp::Delete),
        "{:?}",
        summary(&after)
    );
    // Once the owner's file goes, the other file's pod takes the name.
    std::fs::remove_file(dir.path().join("web.yaml")).expect("remove");
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|u: &PodUpdate| u.op == PodOp::Add && !u.pods.is_empty())
    {
        seen.push(h.next().await);
    }
    let added = seen.iter().find(|u| u.op == PodOp::Add).expect("an add");
    assert_ne!(uids(added), running);
    h.stop().await;
}

/// Every pod the updates added and removed, by name.
#[derive(Default)]
struct Tally {
    /// Pod name -> (adds, removes).
    seen: std::collections::BTreeMap<String, (usize, usize)>,
    live: std::collections::BTreeSet<String>,
}

impl Tally {
    fn apply(&mut self, u: &PodUpdate) {
        for p in &u.pods {
            let n = p.metadata.name.clone().unwrap_or_default();
            let e = self.seen.entry(n.clone()).or_default();
            match u.op {
                PodOp::Add => {
                    e.0 += 1;
                    self.live.insert(n);
                }
                PodOp::Remove | PodOp::Delete => {
                    e.1 += 1;
                    self.live.remove(&n);
                }
                _ => {}
            }
        }
    }

    /// Applies updates until the live pods are `want` (60 s at most).
    async fn settle(&mut self, h: &mut Harness, want: &std::collections::BTreeSet<String>) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while self.live != *want {
            assert!(
                std::time::Instant::now() < deadline,
                "{} pods live, {} wanted",
                self.live.len(),
                want.len()
            );
            if let Ok(Some(u)) = tokio::time::timeout(ARRIVAL, h.updates.recv()).await {
                self.apply(&u);
            }
        }
    }
}

/// Issue 36's bad input: 5,000 files of which 100 are invalid, then a burst of 1,000 deletions
/// while 1,000 new manifests arrive, with the periodic re-list running underneath. Every invalid
/// file is reported once, every pod is added once and removed at most once, and the end state is
/// the directory's.
#[tokio::test]
async fn five_thousand_files_and_a_deletion_burst_report_each_invalid_file_once() {
    use std::collections::{BTreeMap, BTreeSet};
    let dir = tempfile::tempdir().expect("tempdir");
    let name = |i: usize| format!("pod-{i:05}");
    let path = |i: usize| dir.path().join(format!("{}.yaml", name(i)));
    let broken = |i: usize| i % 50 == 7;
    let mut invalid = BTreeSet::new();
    for i in 0..5000 {
        if broken(i) {
            // Alternately broken as YAML and as a pod (no name).
            let text = if i % 100 == 7 {
                "apiVersion: v1\nkind: Pod\nmetadata: [unclosed\n"
            } else {
                "apiVersion: v1\nkind: Pod\nmetadata: {}\nspec:\n  containers: []\n"
            };
            write(&path(i), text);
            invalid.insert(path(i).display().to_string());
        } else {
            write(&path(i), &manifest(&name(i), "busybox"));
        }
    }
    assert_eq!(invalid.len(), 100);
    let wanted = |range: std::ops::Range<usize>| -> BTreeSet<String> {
        range
            .filter(|&i| !broken(i))
            .map(|i| format!("{}-node1", name(i)))
            .collect()
    };
    let mut h = Harness::start_with_events(dir.path(), Duration::from_secs(3), 10_000);
    let mut tally = Tally::default();
    let first = wanted(0..5000);
    assert_eq!(first.len(), 4900);
    tally.settle(&mut h, &first).await;

    // The burst: 1,000 deletions interleaved with 1,000 new files.
    for i in 0..1000 {
        std::fs::remove_file(path(i)).expect("remove manifest");
        write(&path(5000 + i), &manifest(&name(5000 + i), "busybox"));
    }
    let mut second = wanted(1000..5000);
    second.extend((5000..6000).map(|i| format!("{}-node1", name(i))));
    assert_eq!(second.len(), 4920);
    tally.settle(&mut h, &second).await;
    // Two more periodic re-lists change nothing.
    let quiet_until = std::time::Instant::now() + Duration::from_secs(7);
    while std::time::Instant::now() < quiet_until {
        if let Ok(Some(u)) = tokio::time::timeout(Duration::from_secs(1), h.updates.recv()).await {
            tally.apply(&u);
        }
    }
    assert_eq!(tally.live, second);
    for (pod, (adds, removes)) in &tally.seen {
        assert_eq!(*adds, 1, "{pod} added once");
        assert!(*removes <= 1, "{pod} removed at most once");
    }
    let removed = tally.seen.values().filter(|v| v.1 == 1).count();
    assert_eq!(removed, 980, "the deleted files' pods, each once");

    // One warning per invalid file (those among the deleted files were reported before they
    // went), none for anything else.
    let mut reported: BTreeMap<String, usize> = BTreeMap::new();
    while let Ok(ev) = h.events.try_recv() {
        assert_eq!(ev.reason, "FailedValidation", "{}", ev.message);
        let file = invalid
            .iter()
            .find(|f| ev.message.contains(f.as_str()))
            .unwrap_or_else(|| panic!("a warning that names no invalid file: {}", ev.message));
        *reported.entry(file.clone()).or_default() += 1;
    }
    assert_eq!(reported.len(), 100, "every invalid file reported");
    assert!(reported.values().all(|&n| n == 1), "{reported:?}");
    h.stop().await;
}

async fn next_snapshot(
    rx: &mut mpsc::Receiver<kubelet_api::SourceSnapshot>,
) -> kubelet_api::SourceSnapshot {
    tokio::time::timeout(ARRIVAL, rx.recv())
        .await
        .expect("a snapshot")
        .expect("open")
}

/// A periodic re-list of files that are as they were (read at least a second after their last
/// write) reads none of them and sends nothing; any change still arrives: a rewrite that keeps
/// the size and the modification time (its change time moves), a new file, a deleted one.
#[tokio::test]
async fn unchanged_files_are_not_read_again_and_no_snapshot_is_sent_for_them() {
    use kubelet_api::{PodSource, SourceSender};
    let dir = tempfile::tempdir().expect("tempdir");
    let past = std::time::SystemTime::now() - Duration::from_secs(10);
    let settled = |path: &Path, text: &str| {
        write(path, text);
        std::fs::File::options()
            .write(true)
            .open(path)
            .and_then(|f| f.set_modified(past))
            .expect("set the modification time");
    };
    for name in ["a", "b", "c"] {
        settled(
            &dir.path().join(format!("{name}.yaml")),
            &manifest(name, "busybox:1.36"),
        );
    }
    let source = FileSource::new(dir.path(), NODE).with_config(
        FileSourceConfig::default()
            .check_frequency(Duration::from_millis(100))
            .debounce(Duration::from_millis(20)),
    );
    let (tx, mut rx) = mpsc::channel(16);
    let out = SourceSender::new("file", tx, EventRecorder::log_only());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { source.run(out, shutdown).await }
    });
    let images = |s: &kubelet_api::SourceSnapshot| -> Vec<String> {
        s.pods
            .iter()
            .map(|p| {
                let spec = p.spec.as_ref().expect("spec");
                format!(
                    "{}={}",
                    p.metadata.name.as_deref().unwrap_or_default(),
                    spec.containers[0].image.as_deref().unwrap_or_default()
                )
            })
            .collect()
    };
    let first = next_snapshot(&mut rx).await;
    assert_eq!(first.pods.len(), 3);
    // Marked as seen by the source itself, so the merge keeps these allocations.
    assert!(
        first
            .pods
            .iter()
            .all(|p| kubelet_api::is_marked_seen(p, "file"))
    );
    // More than ten periods: not one snapshot.
    assert!(
        tokio::time::timeout(QUIET, rx.recv()).await.is_err(),
        "a snapshot of unchanged files was sent"
    );

    // Rewritten in place, same size, modification time put back: seen through the change time.
    settled(&dir.path().join("b.yaml"), &manifest("b", "busybox:1.37"));
    let s = next_snapshot(&mut rx).await;
    assert_eq!(
        images(&s),
        [
            "a-node1=busybox:1.36",
            "b-node1=busybox:1.37",
            "c-node1=busybox:1.36"
        ]
    );
    // The unchanged files' pods are sent as the allocations sent before, not as copies.
    let same: Vec<bool> = (0..3)
        .map(|i| std::sync::Arc::ptr_eq(&first.pods[i], &s.pods[i]))
        .collect();
    assert_eq!(same, [true, false, true]);
    // A new file and a deleted one.
    write(&dir.path().join("d.yaml"), &manifest("d", "busybox:1.36"));
    std::fs::remove_file(dir.path().join("a.yaml")).expect("delete");
    let deadline = tokio::time::Instant::now() + ARRIVAL;
    loop {
        let s = next_snapshot(&mut rx).await;
        let names: Vec<String> = s
            .pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect();
        if names == ["b-node1", "c-node1", "d-node1"] {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{names:?}");
    }
    // A file deleted while it is still too new to be trusted unread: its pod goes too.
    std::fs::remove_file(dir.path().join("d.yaml")).expect("delete");
    let deadline = tokio::time::Instant::now() + ARRIVAL;
    loop {
        let s = next_snapshot(&mut rx).await;
        if s.pods.len() == 2 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{:?}", s.pods.len());
    }
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
}
