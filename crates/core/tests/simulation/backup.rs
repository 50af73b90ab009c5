//! A backup as a state machine: `ops/backup.rs` (`begin`, the re-run loop, `commit`) and
//! `commit.rs` (`check`, `save_snapshot`), one storage operation or so a step.

use super::*;

impl Sim {
    pub(super) fn backup(&mut self, a: usize) -> &mut Backup {
        match &mut self.actors[a].job {
            Job::Backup(b) => b,
            Job::Prune(_) => unreachable!("a backup"),
        }
    }

    pub(super) fn backup_step(&mut self, a: usize, step: BStep) -> Outcome {
        let from = self.actors[a].last_end;
        match step {
            BStep::Start => {
                self.start_session(a, SessionKind::Backup);
                self.backup(a).step = BStep::ReadTrash;
            }
            // `Repository::load_writer_index`: its memory, less the packs not stored and
            // those the notices name.
            BStep::ReadTrash if self.backup_ref(a).writer => {
                let stored: HashSet<u64> = (self.st.packs.list(from, self.st.now, &mut self.rng))
                    .into_iter()
                    .map(|(p, _)| p)
                    .collect();
                let from = self.st.now;
                let noticed = match self.rules.notices {
                    true => self.read_trash(from).noticed,
                    false => HashSet::new(),
                };
                let host = self.actors[a].host;
                let memory: Vec<(u64, Vec<u32>)> = self.writer_memory[host]
                    .iter()
                    .filter(|(p, _)| stored.contains(p) && !noticed.contains(p))
                    .map(|(p, blobs)| (*p, blobs.clone()))
                    .collect();
                let b = self.backup(a);
                b.attempt += 1;
                b.index = Idx::default();
                for (p, blobs) in &memory {
                    b.index.add_pack(*p, blobs);
                }
                b.step = BStep::Observe;
            }
            // `Repository::load_index`: the trash, then the index files.
            BStep::ReadTrash => {
                let trash = self.read_trash(from);
                let b = self.backup(a);
                b.attempt += 1;
                b.index = Idx::default();
                for p in trash.packs.keys() {
                    b.index.condemn(*p);
                }
                b.trash = trash;
                b.step = BStep::ReadIndex;
            }
            BStep::ReadIndex => {
                let listed = self.st.index.list(from, self.st.now, &mut self.rng);
                let mut files = Vec::new();
                let mut vanished = false;
                let attempt = self.backup_ref(a).attempt;
                for (name, _) in listed {
                    match self.st.index.get(name) {
                        Some(f) => files.push(f.clone()),
                        None if attempt < 4 => {
                            vanished = true;
                            break;
                        }
                        None => {}
                    }
                }
                let b = self.backup(a);
                if vanished {
                    b.step = BStep::ReadTrash;
                } else {
                    for (p, blobs) in files.iter().flatten() {
                        b.index.add_pack(*p, blobs);
                    }
                    b.step = BStep::Observe;
                }
            }
            BStep::Observe => {
                // A writer's word on what it observed counts for nothing (`session::list`).
                let b = self.backup(a);
                let observed = match b.writer {
                    true => None,
                    false => b.trash.observed(),
                };
                self.actors[a]
                    .sess
                    .as_mut()
                    .expect("a session")
                    .info
                    .observed = observed;
                // `Session::observe` leaves the file to the heartbeat thread, which writes
                // it `OBSERVE_DELAY` later (at its first turn after that here; never, if
                // the backup is over sooner) while the backup goes on, or, if that write
                // fails, at the next interval.
                let at = self.st.now + OBSERVE_DELAY.as_millis() as u64;
                let sess = self.actors[a].sess.as_mut().expect("a session");
                sess.next_beat = sess.next_beat.min(at);
                self.backup(a).step = BStep::Adopt;
            }
            // A writer can neither judge sessions nor read packs' headers.
            BStep::Adopt if self.backup_ref(a).writer => {
                self.backup(a).step = BStep::Plan;
            }
            // `adopt_after_ended_sessions`.
            BStep::Adopt => {
                let Some(survey) = self.survey(a) else {
                    self.stop_session(a);
                    return Outcome::Exit;
                };
                let ended: Vec<View> = survey
                    .others
                    .iter()
                    .filter(|(_, s)| *s != Standing::Live)
                    .map(|(v, _)| v.clone())
                    .collect();
                if !ended.is_empty() {
                    let unknown: Vec<(u64, Vec<u32>)> = self
                        .st
                        .packs
                        .live()
                        .filter(|(p, _)| !self.backup_ref(a).index.knows_pack(*p))
                        .map(|(p, blobs)| (p, blobs.clone()))
                        .collect();
                    self.write_index(unknown.clone());
                    for (p, blobs) in &unknown {
                        self.backup(a).index.add_pack(*p, blobs);
                    }
                    for v in ended {
                        for name in v.files {
                            delete(&mut self.st.sessions, &mut self.st.now, &mut self.rng, name);
                        }
                    }
                }
                self.backup(a).step = BStep::Plan;
            }
            // A new writer: dedup against live packs only.
            BStep::Plan => {
                let b = self.backup(a);
                b.rounds += 1;
                b.reused.clear();
                b.stored.clear();
                b.to_store.clear();
                for &blob in &b.source {
                    match b.index.contains_live(blob) {
                        true => {
                            b.reused.insert(b.index.get(blob).expect("live"));
                        }
                        false => b.to_store.push(blob),
                    }
                }
                let (reused, new) = (b.reused.clone(), b.to_store.clone());
                let observed = b.trash.observed();
                let condemned: Vec<u64> = b.trash.packs.keys().copied().collect();
                self.log(|| {
                    format!(
                        "actor {a}: observed {observed:?} condemned {condemned:x?}, \
                         reuses {reused:x?}, stores {new:?}"
                    )
                });
                let b = self.backup(a);
                b.step = match b.to_store.is_empty() {
                    true => BStep::WriteIndex,
                    false => BStep::WritePack,
                };
            }
            BStep::WritePack => {
                let b = self.backup(a);
                let n = b.to_store.len().min(BLOBS_PER_PACK);
                let blobs: Vec<u32> = b.to_store.drain(..n).collect();
                let pack = self.st.write_pack(&mut self.rng, blobs.clone());
                let b = self.backup(a);
                b.stored.push((pack, blobs.clone()));
                b.unindexed.push((pack, blobs));
                if b.unindexed.len() >= PACKS_PER_INTERIM_INDEX {
                    let interim = std::mem::take(&mut b.unindexed);
                    self.write_index(interim);
                }
                let b = self.backup(a);
                if b.to_store.is_empty() {
                    b.step = BStep::WriteIndex;
                }
            }
            BStep::WriteIndex => {
                let unindexed = std::mem::take(&mut self.backup(a).unindexed);
                self.write_index(unindexed);
                let b = self.backup(a);
                for (p, blobs) in b.stored.clone() {
                    b.index.add_pack(p, &blobs);
                }
                b.step = BStep::Check;
            }
            BStep::Check => {
                self.backup(a).checked_at = self.st.now;
                let bad = self.commit_check(a);
                if !bad.is_empty() {
                    return self.store_again(a, bad);
                }
                self.backup(a).step = BStep::Snapshot;
            }
            // `commit::save_snapshot`.
            BStep::Snapshot => {
                let source = self.backup(a).source.clone();
                let snap = write(
                    &mut self.st.snapshots,
                    &mut self.st.now,
                    &mut self.rng,
                    source,
                );
                if self.st.now - self.backup(a).checked_at >= LOST_AFTER {
                    let bad = self.commit_check(a);
                    if !bad.is_empty() {
                        delete(
                            &mut self.st.snapshots,
                            &mut self.st.now,
                            &mut self.rng,
                            snap,
                        );
                        return self.store_again(a, bad);
                    }
                }
                let b = self.backup(a);
                b.snapshot = Some(snap);
                b.step = BStep::Finish;
            }
            BStep::Finish => {
                if self.backup_ref(a).writer {
                    // `remember_as_writer`: the index's packs by blob (`by_pack`), each blob
                    // in the pack that holds it for the index.
                    let b = self.backup_ref(a);
                    let mut memory: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
                    for blob in b.index.holders.keys() {
                        if let Some(p) = b.index.get(*blob) {
                            memory.entry(p).or_default().push(*blob);
                        }
                    }
                    let host = self.actors[a].host;
                    self.writer_memory[host] = memory;
                }
                self.finish_session(a);
                let snap = self.backup(a).snapshot.expect("a snapshot");
                self.committed.push((a, snap));
                self.log(|| format!("actor {a}: committed snapshot {snap:x}"));
                return Outcome::Exit;
            }
        }
        Outcome::Continue
    }

    pub(super) fn backup_ref(&self, a: usize) -> &Backup {
        match &self.actors[a].job {
            Job::Backup(b) => b,
            Job::Prune(_) => unreachable!("a backup"),
        }
    }

    /// `commit::check`: the packs this backup must not build on.
    pub(super) fn commit_check(&mut self, a: usize) -> Vec<u64> {
        if !self.rules.commit_check {
            return Vec::new();
        }
        let lost = self.lost(a);
        if lost && self.rules.heartbeat {
            self.beat(a);
        }
        if self.backup_ref(a).writer {
            return self.check_as_writer(a, lost);
        }
        // Read by every session: a condemnation in a generation it observed may go at once.
        let trash = self.read_trash(self.st.now);
        let observed = self.actors[a].sess.as_ref().and_then(|s| s.info.observed);
        let b = self.backup_ref(a);
        let relied: HashSet<PackId> = b
            .reused
            .iter()
            .chain(b.stored.iter().map(|(p, _)| p))
            .map(|p| pack_id(*p))
            .collect();
        let gone: Vec<u64> = relied
            .iter()
            .map(pack_of)
            .filter(|p| !self.st.packs.exists(*p))
            .collect();
        if !gone.is_empty() {
            self.mark_missing(&gone);
        }
        let packs = &self.st.packs;
        let bad = unsafe_packs(
            &relied,
            |p| packs.exists(pack_of(p)),
            |p| match trash.packs.get(&pack_of(p)) {
                Some(g) => deletable_under(*g, observed, lost),
                None => lost && trash.problems,
            },
        );
        let bad: Vec<u64> = bad.iter().map(pack_of).collect();
        if !bad.is_empty() {
            self.log(|| format!("actor {a}: commit check: unsafe packs {bad:x?}"));
        }
        bad
    }

    /// `commit::check_as_writer`: a lost writer cannot tell what prunes condemned
    /// meanwhile, so everything it relies on is unsafe; otherwise what is not stored.
    fn check_as_writer(&mut self, a: usize, lost: bool) -> Vec<u64> {
        let b = self.backup_ref(a);
        let relied: Vec<u64> = b
            .reused
            .iter()
            .chain(b.stored.iter().map(|(p, _)| p))
            .copied()
            .collect();
        let now = self.st.now;
        let stored: HashSet<u64> = (self.st.packs.list(now, now, &mut self.rng))
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        let bad: Vec<u64> = relied
            .into_iter()
            .filter(|p| lost || !stored.contains(p))
            .collect();
        if !bad.is_empty() {
            self.log(|| format!("actor {a}: writer's commit check: unsafe packs {bad:x?}"));
        }
        bad
    }

    /// The re-run loop of `backup`: store again what those packs held, or fail.
    pub(super) fn store_again(&mut self, a: usize, bad: Vec<u64>) -> Outcome {
        let b = self.backup(a);
        if b.rounds < MAX_ROUNDS {
            for p in bad {
                b.index.condemn(p);
            }
            b.step = BStep::Plan;
            return Outcome::Continue;
        }
        self.log(|| format!("actor {a}: backup fails, no snapshot"));
        self.stop_session(a);
        Outcome::Exit
    }
}
