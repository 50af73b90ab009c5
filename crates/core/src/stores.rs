//! Objects stored on threads of their own, their results taken in the order they were
//! sent: the blob writer's packer fills the next pack while earlier ones are written and
//! made durable, and still learns of each pack's store in order, so that an index file
//! names only packs whose store has returned.
//!
//! Why: storing a 16 MiB pack (write, fsync, link, fsync of its directory) took the
//! packer thread about as long as the whole backup took (`backup --stats`, write phase),
//! and meanwhile the sealers waited on the writer's full budget. A remote store waits
//! on the network for as long.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cairn_storage::{Storage, UnnamedWrite};
use crossbeam_channel::{unbounded, Receiver, Sender};

use crate::error::{Error, Result};

/// One object's store, done.
pub struct Stored<T> {
    /// What the caller sent with it.
    pub tag: T,
    /// The object's bytes, handed back for reuse (none for [`Body::Written`]).
    pub bytes: Vec<u8>,
    /// How long the store took.
    pub took: Duration,
}

struct Job {
    seq: u64,
    name: String,
    body: Body,
}

/// What a store writes.
pub enum Body {
    /// The object's bytes.
    Bytes(Vec<u8>),
    /// An object already written ([`Storage::begin_unnamed_write`]), to commit under its
    /// name: made durable and linked into place.
    Written(Box<dyn UnnamedWrite>),
}

/// A store's result as it comes back, for [`Stores::arrived`].
pub struct Arrival(u64, Result<(Vec<u8>, Duration)>);

/// Up to `threads` stores at once, in the background.
pub struct Stores<T> {
    jobs: Option<Sender<Job>>,
    results: Receiver<Arrival>,
    threads: Vec<JoinHandle<()>>,
    /// Sent and not yet taken, oldest first.
    waiting: VecDeque<(u64, T)>,
    /// Results that came back before an older one.
    early: HashMap<u64, Result<(Vec<u8>, Duration)>>,
    next: u64,
}

impl<T> Stores<T> {
    /// `threads` storing into `storage`; with `None` (a dry run) every store returns at
    /// once and nothing is written.
    pub fn new(storage: Option<Arc<dyn Storage>>, threads: usize) -> Self {
        let (jobs, job_rx) = unbounded::<Job>();
        let (done_tx, results) = unbounded::<Arrival>();
        let threads = (0..threads.max(1))
            .map(|_| {
                let (jobs, done) = (job_rx.clone(), done_tx.clone());
                let storage = storage.clone();
                std::thread::spawn(move || {
                    for Job { seq, name, body } in jobs {
                        let started = Instant::now();
                        // A panic would leave its result missing and the caller waiting.
                        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                            match (&storage, body) {
                                (Some(storage), Body::Bytes(bytes)) => {
                                    storage.write(&name, &bytes).map(|()| bytes)
                                }
                                (_, Body::Written(object)) => {
                                    object.commit_as(&name).map(|()| Vec::new())
                                }
                                (None, Body::Bytes(bytes)) => Ok(bytes),
                            }
                            .map_err(Into::into)
                        }))
                        .unwrap_or_else(|_| {
                            Err(Error::InvalidInput(format!("storing {name} panicked")))
                        })
                        .map(|bytes| (bytes, started.elapsed()));
                        if done.send(Arrival(seq, result)).is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        Stores {
            jobs: Some(jobs),
            results,
            threads,
            waiting: VecDeque::new(),
            early: HashMap::new(),
            next: 0,
        }
    }

    /// Starts storing `body` under `name`.
    pub fn send(&mut self, name: String, body: Body, tag: T) {
        let seq = self.next;
        self.next += 1;
        self.waiting.push_back((seq, tag));
        if let Some(jobs) = &self.jobs {
            // The threads end only when `jobs` is dropped, so the send cannot fail.
            let _ = jobs.send(Job { seq, name, body });
        }
    }

    /// Stores sent and not yet taken.
    pub fn in_flight(&self) -> usize {
        self.waiting.len()
    }

    /// Where results arrive: for a caller that waits on them beside other work (with
    /// `crossbeam_channel::select!`) and hands each to [`arrived`](Self::arrived).
    pub fn arrivals(&self) -> Receiver<Arrival> {
        self.results.clone()
    }

    /// Keeps a result that arrived until [`take_oldest`](Self::take_oldest) or
    /// [`try_take_oldest`](Self::try_take_oldest) reaches it.
    pub fn arrived(&mut self, arrival: Arrival) {
        self.early.insert(arrival.0, arrival.1);
    }

    /// The oldest store not yet taken if it is done; `None` if it is not, or there is none.
    pub fn try_take_oldest(&mut self) -> Option<Result<Stored<T>>> {
        let &(seq, _) = self.waiting.front()?;
        while !self.early.contains_key(&seq) {
            let arrival = self.results.try_recv().ok()?;
            self.arrived(arrival);
        }
        self.take_oldest()
    }

    /// Waits for the oldest store not yet taken; `None` when there is none.
    pub fn take_oldest(&mut self) -> Option<Result<Stored<T>>> {
        let (seq, tag) = self.waiting.pop_front()?;
        let result = loop {
            if let Some(result) = self.early.remove(&seq) {
                break result;
            }
            match self.results.recv() {
                Ok(Arrival(s, result)) if s == seq => break result,
                Ok(arrival) => self.arrived(arrival),
                // Every thread is gone, so this store never ran: the threads end early
                // only by panicking.
                Err(_) => {
                    break Err(Error::InvalidInput(
                        "the threads storing packs stopped".into(),
                    ))
                }
            }
        };
        Some(result.map(|(bytes, took)| Stored { tag, bytes, took }))
    }
}

impl<T> Drop for Stores<T> {
    /// Lets the stores under way finish (what an error left in flight is then stored but
    /// named by no index, as after a crash).
    fn drop(&mut self) {
        self.jobs = None;
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use cairn_storage::LocalStorage;

    use super::*;

    #[test]
    fn results_come_back_in_the_order_sent_whatever_finishes_first() {
        let dir = tempfile::tempdir().unwrap();
        let storage: Arc<dyn Storage> = Arc::new(LocalStorage::new(dir.path()));
        let mut stores = Stores::new(Some(storage.clone()), 4);
        // Large and small objects, so that later ones often finish first.
        for i in 0..32u32 {
            let len = if i % 2 == 0 { 4 << 20 } else { 10 };
            let bytes = Body::Bytes(vec![i as u8; len]);
            stores.send(format!("data/{i:02x}/{i}"), bytes, i);
        }
        assert_eq!(stores.in_flight(), 32);
        let mut taken = 0;
        while let Some(done) = stores.try_take_oldest() {
            assert_eq!(done.unwrap().tag, taken, "only the oldest is taken");
            taken += 1;
        }
        for i in taken..32u32 {
            let stored = stores.take_oldest().unwrap().unwrap();
            assert_eq!(stored.tag, i);
            assert_eq!(stored.bytes[0], i as u8);
            assert!(storage.exists(&format!("data/{i:02x}/{i}")).unwrap());
        }
        assert!(stores.take_oldest().is_none());
    }

    #[test]
    fn a_failed_store_is_the_result_of_its_own_object() {
        let dir = tempfile::tempdir().unwrap();
        let storage: Arc<dyn Storage> = Arc::new(LocalStorage::new(dir.path()));
        storage.write("data/00/taken", b"first").unwrap();
        let mut stores = Stores::new(Some(storage), 2);
        stores.send("data/00/free".into(), Body::Bytes(b"a".to_vec()), "free");
        stores.send("data/00/taken".into(), Body::Bytes(b"b".to_vec()), "taken");
        assert!(stores.take_oldest().unwrap().is_ok());
        let Some(Err(err)) = stores.take_oldest() else {
            panic!("an existing name is an error")
        };
        assert!(err.to_string().contains("taken"), "{err}");
    }
}
