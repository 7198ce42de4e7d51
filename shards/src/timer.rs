//! A shard's timers and stop flags: a [`StopSignal`] that wakes whoever waits on it and is
//! never polled, and [`every`], a task that runs a body at a period until told to stop.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Duration;

/// A stop flag that wakes whoever waits on it, once; nothing polls it.
#[derive(Default)]
pub struct StopSignal {
    set: Cell<bool>,
    wakers: RefCell<Vec<Waker>>,
}

/// Waiters one signal keeps at most: a waiter polled again with the same waker is kept once.
const WAITERS_MAX: usize = 1024;

impl StopSignal {
    /// Sets the flag and wakes every waiter.
    pub fn stop(&self) {
        self.set.set(true);
        for w in self.wakers.borrow_mut().drain(..) {
            w.wake();
        }
    }

    /// Whether [`StopSignal::stop`] has been called.
    pub fn is_stopped(&self) -> bool {
        self.set.get()
    }

    /// Resolves once [`StopSignal::stop`] has been called.
    pub fn wait(&self) -> impl Future<Output = ()> + '_ {
        futures_lite::future::poll_fn(move |cx| {
            if self.set.get() {
                return Poll::Ready(());
            }
            let mut wakers = self.wakers.borrow_mut();
            if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
                assert!(
                    wakers.len() < WAITERS_MAX,
                    "a stop signal's waiters are few"
                );
                wakers.push(cx.waker().clone());
            }
            Poll::Pending
        })
    }

    /// `fut`'s output, or `None` once stopped (the stop wins when both are ready: a timer that
    /// elapsed while the shard was busy does not outrun a stop that came meanwhile).
    pub async fn or_stop<T>(&self, fut: impl Future<Output = T>) -> Option<T> {
        let stopped = async {
            self.wait().await;
            None
        };
        futures_lite::future::or(stopped, async { Some(fut.await) }).await
    }
}

/// Runs `tick` every `period` on this shard until `stop` is set (checked after each sleep)
/// or `tick` answers `false`.
pub fn every<F, Fut>(period: Duration, stop: Rc<StopSignal>, mut tick: F)
where
    F: FnMut() -> Fut + 'static,
    Fut: Future<Output = bool> + 'static,
{
    assert!(!period.is_zero(), "a periodic task has a period");
    glommio::spawn_local(async move {
        while stop.or_stop(glommio::timer::sleep(period)).await.is_some() {
            if !tick().await {
                return;
            }
        }
    })
    .detach();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_signal_wakes_its_waiter_once_and_stays_set() {
        crate::run_local(async {
            let stop = Rc::new(StopSignal::default());
            let s = stop.clone();
            let waiter = glommio::spawn_local(async move {
                s.or_stop(futures_lite::future::pending::<()>()).await
            });
            glommio::yield_if_needed().await;
            futures_lite::future::yield_now().await;
            stop.stop();
            assert_eq!(waiter.await, None);
            assert!(stop.is_stopped());
            assert_eq!(
                stop.or_stop(async { 1 }).await,
                None,
                "once stopped, the stop wins over a ready future"
            );
        })
        .unwrap();
    }

    #[test]
    fn a_periodic_task_ticks_until_stopped() {
        crate::run_local(async {
            let stop = Rc::new(StopSignal::default());
            let ticks = Rc::new(Cell::new(0u32));
            let t = ticks.clone();
            every(Duration::from_millis(2), stop.clone(), move || {
                t.set(t.get() + 1);
                async { true }
            });
            glommio::timer::sleep(Duration::from_millis(30)).await;
            // The shard is busy past the next tick's time before the stop is seen: the stop
            // still wins.
            std::thread::sleep(Duration::from_millis(5));
            stop.stop();
            let seen = ticks.get();
            assert!(seen >= 1, "{seen} ticks in 30 ms of a 2 ms period");
            glommio::timer::sleep(Duration::from_millis(10)).await;
            assert_eq!(ticks.get(), seen, "no tick after the stop");
        })
        .unwrap();
    }
}
