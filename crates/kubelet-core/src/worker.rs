//! One pod worker: a task per pod UID that syncs the pod, terminates it and cleans it up, never
//! two of those at once (the kubelet's `podWorkerLoop`).
//!
//! Its life is the enum [`Lifecycle`] and its decisions the pure function [`step`]: given the
//! stage and what just happened ([`Input`]), the next stage and what to do next ([`Action`]).
//! [`worker_loop`] only carries the actions out and feeds their results back. The stages are the
//! kubelet's `podSyncStatus`: syncing, terminating (containers being stopped), terminated (all
//! stopped, waiting for the pod to leave its sources) and finished (cleaned up).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::sync::{Engine, SyncOutcome};
use kubelet_api::KillPodOptions;
use kubelet_api::pod;
use kubelet_api::runtime::PodRuntimeStatus;

/// Where a pod worker is in its pod's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lifecycle {
    /// The pod should run: each wake-up syncs it.
    Syncing,
    /// Its containers are being stopped (a kill was requested, the pod was deleted, or it
    /// reached a terminal phase).
    Terminating,
    /// Everything is stopped; cleanup waits until the pod has left every source.
    Terminated,
    /// Cleaned up; the worker ends.
    Finished,
}

/// What the worker learnt: a wake-up with the shared state's view, or an action's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Input {
    /// Woken (an update, a PLEG event, a requeue timer).
    Woke {
        /// A kill was requested or the pod is marked deleted.
        stop: bool,
        /// The pod left every source (or is an orphan).
        removed: bool,
    },
    /// `sync_pod` ran.
    Synced(SyncOutcome),
    /// A static pod of the same full name still runs: try again after this long.
    PredecessorRunning(Duration),
    /// Termination is not complete: try again after this long.
    TerminationPending(Duration),
    /// Every container is stopped.
    TerminationDone {
        /// The pod left every source meanwhile.
        removed: bool,
    },
    /// The pod's resources are cleaned up.
    CleanedUp {
        /// The pod was added again while being torn down: run it again.
        restart: bool,
    },
}

/// What the worker does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Sleep until woken, or until `requeue` passes.
    Wait {
        /// When to wake up by itself.
        requeue: Option<Duration>,
    },
    /// Sync the pod.
    Sync,
    /// Stop its containers.
    Terminate,
    /// Clean up its volumes, directories and status.
    Cleanup,
    /// End the worker.
    Finish,
}

const fn wait(requeue: Option<Duration>) -> Action {
    Action::Wait { requeue }
}

/// The worker's decision: the next stage and action for an input in a stage.
pub(crate) fn step(stage: Lifecycle, input: &Input) -> (Lifecycle, Action) {
    use Lifecycle::*;
    match (stage, input) {
        (Finished, _) => (Finished, Action::Finish),
        (Syncing, Input::Woke { stop: true, .. }) => (Terminating, Action::Terminate),
        (Syncing, Input::Woke { stop: false, .. }) => (Syncing, Action::Sync),
        (Syncing, Input::PredecessorRunning(d)) => (Syncing, wait(Some(*d))),
        (Syncing, Input::Synced(SyncOutcome::Requeue(d))) => (Syncing, wait(Some(*d))),
        // A sync that changed the runtime has had the PLEG inspect the pod at its release.
        (Syncing, Input::Synced(SyncOutcome::Changed(d))) => (Syncing, wait(Some(*d))),
        (Syncing, Input::Synced(SyncOutcome::Terminal)) => (Terminating, Action::Terminate),
        (Terminating, Input::Woke { .. }) => (Terminating, Action::Terminate),
        (Terminating, Input::TerminationPending(d)) => (Terminating, wait(Some(*d))),
        (Terminating, Input::TerminationDone { removed: true }) => (Terminated, Action::Cleanup),
        (Terminating, Input::TerminationDone { removed: false }) => (Terminated, wait(None)),
        (Terminated, Input::Woke { removed: true, .. }) => (Terminated, Action::Cleanup),
        (Terminated, Input::Woke { removed: false, .. }) => (Terminated, wait(None)),
        (Terminated, Input::CleanedUp { restart: false }) => (Finished, Action::Finish),
        // Decide again at once, from a runtime view that saw the cleanup.
        (Terminated, Input::CleanedUp { restart: true }) => (Syncing, wait(Some(Duration::ZERO))),
        // An input that does not belong to the stage (a result of an action the stage does not
        // take) changes nothing: wait for the next wake-up.
        (stage, _) => (stage, wait(None)),
    }
}

/// The granularity of the pod workers' longer waits: see [`wake_at`].
const WAKE_GRID: Duration = Duration::from_secs(1);

/// When a worker that waits `d` from `now` wakes up: waits of a second or more (resyncs,
/// back-offs) end on the next whole second since `epoch` (the engine's start), so the resyncs
/// of many pods come due together and the runtime wakes once per second for them rather than
/// once per pod; the kubelet's sync loop takes due pods from its work queue on a 1 s tick too.
/// Shorter waits end when asked.
pub(crate) fn wake_at(now: Instant, epoch: Instant, d: Duration) -> Instant {
    let at = now + d;
    if d < WAKE_GRID {
        return at;
    }
    let grid = WAKE_GRID.as_nanos();
    let into = at.saturating_duration_since(epoch).as_nanos() % grid;
    if into == 0 {
        at
    } else {
        // Less than a second: the difference fits in u64 nanoseconds.
        at + Duration::from_nanos(u64::try_from(grid - into).unwrap_or(0))
    }
}

/// The worker's state shared with the sync loop, which updates the pod and the requests.
#[derive(Debug)]
pub(crate) struct WorkerState {
    pub(crate) pod: Arc<Pod>,
    /// A kill was requested (removal from config, eviction, orphan).
    pub(crate) kill: Option<KillPodOptions>,
    /// Callers waiting for termination.
    pub(crate) kill_waiters: Vec<oneshot::Sender<()>>,
    /// The pod left every source: clean up once terminated.
    pub(crate) removed: bool,
    /// The pod is a runtime pod unknown to every source.
    pub(crate) orphan: bool,
    /// The worker's stage (set by the worker only).
    pub(crate) lifecycle: Lifecycle,
    /// The pod was added again while being torn down: run it again once cleanup is done
    /// (the kubelet's `restartRequested`).
    pub(crate) restart_requested: bool,
}

impl WorkerState {
    pub(crate) fn new(pod: Arc<Pod>, orphan: bool) -> Self {
        Self {
            pod,
            kill: orphan.then(KillPodOptions::default),
            kill_waiters: Vec::new(),
            removed: orphan,
            orphan,
            lifecycle: Lifecycle::Syncing,
            restart_requested: false,
        }
    }

    /// All containers are stopped (or the worker is done).
    pub(crate) fn terminated(&self) -> bool {
        matches!(self.lifecycle, Lifecycle::Terminated | Lifecycle::Finished)
    }
}

/// Run one pod's worker until it finishes or `shutdown` fires.
pub(crate) async fn worker_loop(
    engine: Arc<Engine>,
    state: Arc<Mutex<WorkerState>>,
    notify: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let (uid, orphan) = {
        let st = state.lock();
        (pod::uid(&st.pod).to_string(), st.orphan)
    };
    let mut stage = Lifecycle::Syncing;
    let mut action = wait(None);
    // The next sync waits for a runtime view observed after this instant.
    let mut last_sync: Option<Instant> = None;
    // The runtime status the termination observed after the kill: what the cleanup removes.
    let mut after_kill: Option<PodRuntimeStatus> = None;
    // The termination's hold on the pod's events, kept for the cleanup that follows at once
    // when the pod has left its sources: the stops' and the removals' events are then looked
    // at once, at the cleanup's release, instead of an inspection at each release.
    let mut held_over = None;
    loop {
        let input = match action {
            Action::Finish => return,
            Action::Wait { requeue } => {
                let wake = async {
                    match requeue {
                        Some(d) => {
                            let at = wake_at(Instant::now(), engine.started_at(), d);
                            tokio::time::sleep_until(at).await;
                        }
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = notify.notified() => {}
                    _ = wake => {}
                }
                let st = state.lock();
                Input::Woke {
                    stop: st.kill.is_some() || pod::is_deleted(&st.pod),
                    removed: st.removed,
                }
            }
            Action::Sync => {
                // A pod started again: what an earlier termination saw is not what it has.
                after_kill = None;
                let mut pod = state.lock().pod.clone();
                // Static pods with the same full name run one at a time.
                if let Some(wait) = engine.wait_for_static_predecessor(&pod) {
                    Input::PredecessorRunning(wait)
                } else {
                    let since = last_sync.unwrap_or_else(|| engine.started_at());
                    // Waiting for a newer runtime view can take until the PLEG's next global
                    // timestamp (seconds with the evented PLEG); a kill or deletion arriving
                    // meanwhile is not kept waiting for it (the kubelet's pod workers are: up to
                    // 2 s between a deletion and the kill).
                    let cache = engine.cache();
                    let newer = cache.get_newer_than(&uid, since);
                    tokio::pin!(newer);
                    let waited = loop {
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            e = &mut newer => break Ok(e),
                            _ = notify.notified() => {
                                let st = state.lock();
                                if st.kill.is_some() || pod::is_deleted(&st.pod) {
                                    break Err(st.removed);
                                }
                                // A newer pod: the sync takes it.
                                pod = st.pod.clone();
                            }
                        }
                    };
                    match waited {
                        Err(removed) => Input::Woke {
                            stop: true,
                            removed,
                        },
                        Ok(entry) => {
                            let operation = engine.start_metrics().sync_begins(&uid);
                            let began = std::time::Instant::now();
                            // The PLEG holds the pod's runtime events during the sync: the
                            // changes the sync makes are inspected once, at the release, not
                            // once per event. As the kubelet's post-sync relist request, that
                            // inspection starts after the sync, so it is newer than
                            // `last_sync` and the next sync (woken by its PLEG event) need not
                            // wait for a relist or, with the evented PLEG, for the global
                            // timestamp (2 to 4 s away).
                            let mut hold = engine.hold_pod(&pod);
                            // Boxed, as the calls below: an idle worker then holds no room for
                            // a sync's state.
                            let outcome = Box::pin(engine.sync_pod(&pod, entry)).await;
                            engine.start_metrics().sync_done(operation, began);
                            // As the kubelet: the next sync waits for a runtime view observed
                            // after this sync finished, so it sees what this sync created. Taken
                            // before the release, whose inspection must start after it.
                            last_sync = Some(Instant::now());
                            hold.changed = matches!(outcome, SyncOutcome::Changed(_));
                            drop(hold);
                            Input::Synced(outcome)
                        }
                    }
                }
            }
            Action::Terminate => {
                let (pod, opts) = {
                    let st = state.lock();
                    (st.pod.clone(), st.kill.clone().unwrap_or_default())
                };
                // The status to kill from: the cache's, when observed after the last sync.
                let since = last_sync.unwrap_or_else(|| engine.started_at());
                let known = engine
                    .cache()
                    .get_if_newer(&uid, since)
                    .and_then(|e| e.status.ok());
                // Held as a sync: the stops' events are inspected once, at the release.
                let mut hold = engine.hold_pod(&pod);
                hold.changed = true;
                match Box::pin(engine.sync_terminating_pod(&pod, &opts, orphan, known)).await {
                    Ok(after) => {
                        after_kill = after;
                        Box::pin(engine.sync_terminated_pod(&pod, &opts, orphan)).await;
                        // The stage is set under the same lock that takes the waiters, so a kill
                        // request arriving now sees the pod terminated instead of queueing a
                        // waiter nobody would answer (`step` then confirms the stage).
                        let (waiters, removed) = {
                            let mut st = state.lock();
                            st.lifecycle = Lifecycle::Terminated;
                            (std::mem::take(&mut st.kill_waiters), st.removed)
                        };
                        for w in waiters {
                            let _ = w.send(());
                        }
                        if removed {
                            held_over = Some(hold);
                        }
                        Input::TerminationDone { removed }
                    }
                    Err(wait) => Input::TerminationPending(wait),
                }
            }
            Action::Cleanup => {
                let pod = state.lock().pod.clone();
                // Held as a sync: the removals' events are looked at once, at the release.
                let mut hold = held_over.take().unwrap_or_else(|| engine.hold_pod(&pod));
                hold.changed = true;
                let emptied = Box::pin(engine.cleanup_pod(&pod, orphan, after_kill.take())).await;
                let restart = {
                    let mut st = state.lock();
                    let restart = std::mem::take(&mut st.restart_requested);
                    if restart {
                        st.removed = false;
                        st.kill = None;
                        st.lifecycle = Lifecycle::Syncing;
                    } else {
                        // Nothing of the pod is left: the PLEG forgets it instead of inspecting
                        // it, before the worker counts as finished (a worker started afterwards
                        // for the same UID must not find the old entry in the cache).
                        hold.gone = emptied;
                        st.lifecycle = Lifecycle::Finished;
                    }
                    drop(hold);
                    restart
                };
                if restart {
                    tracing::info!(podUID = %uid, "pod added again while terminating; starting it again");
                    // Wait for a relist that saw the cleanup before deciding anything.
                    last_sync = Some(Instant::now());
                }
                Input::CleanedUp { restart }
            }
        };
        let (next, act) = step(stage, &input);
        if next != stage {
            tracing::debug!(podUID = %uid, from = ?stage, to = ?next, "pod worker stage");
            state.lock().lifecycle = next;
        }
        stage = next;
        action = act;
    }
}

#[cfg(test)]
mod tests {
    use super::Lifecycle::*;
    use super::*;

    const D: Duration = Duration::from_secs(3);

    fn woke(stop: bool, removed: bool) -> Input {
        Input::Woke { stop, removed }
    }

    #[test]
    fn the_worker_steps_through_a_pods_life_as_the_kubelets_pod_workers() {
        let table: Vec<(Lifecycle, Input, Lifecycle, Action)> = vec![
            // Syncing: a wake-up syncs, unless a kill or deletion is pending.
            (Syncing, woke(false, false), Syncing, Action::Sync),
            (Syncing, woke(true, false), Terminating, Action::Terminate),
            (Syncing, woke(true, true), Terminating, Action::Terminate),
            (
                Syncing,
                Input::PredecessorRunning(D),
                Syncing,
                wait(Some(D)),
            ),
            (
                Syncing,
                Input::Synced(SyncOutcome::Requeue(D)),
                Syncing,
                wait(Some(D)),
            ),
            (
                Syncing,
                Input::Synced(SyncOutcome::Changed(D)),
                Syncing,
                wait(Some(D)),
            ),
            (
                Syncing,
                Input::Synced(SyncOutcome::Terminal),
                Terminating,
                Action::Terminate,
            ),
            // Terminating: retried on every wake-up and after the wait it asked for.
            (
                Terminating,
                woke(false, false),
                Terminating,
                Action::Terminate,
            ),
            (
                Terminating,
                Input::TerminationPending(D),
                Terminating,
                wait(Some(D)),
            ),
            (
                Terminating,
                Input::TerminationDone { removed: false },
                Terminated,
                wait(None),
            ),
            (
                Terminating,
                Input::TerminationDone { removed: true },
                Terminated,
                Action::Cleanup,
            ),
            // Terminated: nothing until the pod leaves its sources; never synced again.
            (Terminated, woke(false, false), Terminated, wait(None)),
            (Terminated, woke(true, false), Terminated, wait(None)),
            (Terminated, woke(false, true), Terminated, Action::Cleanup),
            (
                Terminated,
                Input::CleanedUp { restart: false },
                Finished,
                Action::Finish,
            ),
            (
                Terminated,
                Input::CleanedUp { restart: true },
                Syncing,
                wait(Some(Duration::ZERO)),
            ),
            // Finished stays finished.
            (Finished, woke(false, false), Finished, Action::Finish),
            (Finished, woke(true, true), Finished, Action::Finish),
        ];
        for (stage, input, want_stage, want_action) in table {
            assert_eq!(
                step(stage, &input),
                (want_stage, want_action),
                "{stage:?} + {input:?}"
            );
        }
    }

    #[test]
    fn waits_of_a_second_or_more_end_on_the_engines_whole_seconds() {
        let epoch = Instant::now();
        let ms = Duration::from_millis;
        // Shorter waits end when asked.
        let now = epoch + ms(1_234);
        assert_eq!(wake_at(now, epoch, ms(200)), now + ms(200));
        // Longer ones on the next whole second since the epoch.
        assert_eq!(wake_at(now, epoch, ms(60_000)), epoch + ms(62_000));
        assert_eq!(wake_at(now, epoch, ms(1_000)), epoch + ms(3_000));
        assert_eq!(
            wake_at(epoch + ms(2_000), epoch, ms(5_000)),
            epoch + ms(7_000)
        );
        // Two pods whose resyncs fall in the same second wake together.
        assert_eq!(
            wake_at(epoch + ms(10), epoch, ms(61_500)),
            wake_at(epoch + ms(900), epoch, ms(60_950)),
        );
    }

    #[test]
    fn inputs_foreign_to_a_stage_change_nothing() {
        let foreign = [
            (Syncing, Input::TerminationDone { removed: true }),
            (Syncing, Input::CleanedUp { restart: false }),
            (Terminating, Input::Synced(SyncOutcome::Terminal)),
            (Terminated, Input::Synced(SyncOutcome::Requeue(D))),
            (Terminated, Input::TerminationPending(D)),
        ];
        for (stage, input) in foreign {
            assert_eq!(step(stage, &input), (stage, wait(None)), "{input:?}");
        }
    }

    #[test]
    fn a_killed_pod_never_syncs_again_whatever_comes_next() {
        // Walk every sequence of up to four inputs from a kill and check that no Sync follows
        // until a restart (CleanedUp { restart: true }) brings the worker back to Syncing.
        let inputs = [
            woke(false, false),
            woke(true, false),
            woke(false, true),
            Input::Synced(SyncOutcome::Requeue(D)),
            Input::TerminationPending(D),
            Input::TerminationDone { removed: false },
            Input::TerminationDone { removed: true },
            Input::CleanedUp { restart: false },
        ];
        let mut frontier = vec![step(Syncing, &woke(true, false)).0];
        for _ in 0..4 {
            let mut next = Vec::new();
            for stage in &frontier {
                for input in &inputs {
                    let (s, a) = step(*stage, input);
                    assert_ne!(a, Action::Sync, "{stage:?} + {input:?}");
                    assert_ne!(s, Syncing, "{stage:?} + {input:?}");
                    next.push(s);
                }
            }
            next.dedup();
            frontier = next;
        }
    }
}
