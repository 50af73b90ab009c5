//! A prune as a state machine: `ops/prune.rs` and `Session::start_maintenance`, one
//! phase a step.

use super::*;

impl Sim {
    pub(super) fn prune(&mut self, a: usize) -> &mut Prune {
        match &mut self.actors[a].job {
            Job::Prune(p) => p,
            Job::Backup(_) => unreachable!("a prune"),
        }
    }

    pub(super) fn refuse(&mut self, a: usize, why: &str) -> Outcome {
        self.log(|| format!("actor {a}: prune stops: {why}"));
        self.stop_session(a);
        Outcome::Exit
    }

    pub(super) fn prune_step(&mut self, a: usize, step: PStep) -> Outcome {
        let from = self.actors[a].last_end;
        match step {
            PStep::Start => {
                self.start_session(a, SessionKind::Maintenance);
                self.prune(a).step = PStep::Refuse;
            }
            // `Session::start_maintenance`.
            PStep::Refuse => {
                let Some(survey) = self.survey(a) else {
                    return self.refuse(a, "own session file missing");
                };
                let other = survey
                    .others
                    .iter()
                    .any(|(v, s)| *s == Standing::Live && v.info.kind == SessionKind::Maintenance);
                if other && self.rules.one_prune {
                    self.log(|| format!("actor {a}: prune refuses: another prune runs"));
                    self.finish_session(a);
                    return Outcome::Exit;
                }
                self.prune(a).step = PStep::List;
            }
            PStep::List => {
                let mut snapshots = HashSet::new();
                let mut used = HashSet::new();
                for (name, _) in self.st.snapshots.list(from, self.st.now, &mut self.rng) {
                    // Removed since it was listed: it needs nothing.
                    let Some(blobs) = self.st.snapshots.get(name) else {
                        continue;
                    };
                    used.extend(blobs.iter().copied());
                    snapshots.insert(name);
                }
                let mut files = Vec::new();
                let now = self.st.now;
                for (name, _) in self.st.index.list(now, now, &mut self.rng) {
                    let Some(file) = self.st.index.get(name) else {
                        return self.refuse(a, "an index file is damaged");
                    };
                    files.push((name, file.clone()));
                }
                let trash = self.read_trash(self.st.now);
                let mut index = Idx::default();
                for p in trash.packs.keys() {
                    index.condemn(*p);
                }
                let mut packs = BTreeMap::new();
                for (_, file) in &files {
                    for (p, blobs) in file {
                        index.add_pack(*p, blobs);
                        packs.entry(*p).or_insert_with(|| blobs.clone());
                    }
                }
                let now = self.st.now;
                let stored = self.st.packs.list(now, now, &mut self.rng);
                let rules = self.rules;
                let p = self.prune(a);
                p.snapshots = snapshots;
                p.used = used;
                p.trash = trash;
                p.index = index;
                p.packs = packs;
                p.stored = stored.into_iter().collect();
                // Named by the index but not stored: gone; other copies are the ones
                // needed, and the index written later drops them.
                p.gone = p
                    .packs
                    .keys()
                    .filter(|id| rules.gone_packs && !p.stored.contains_key(id))
                    .copied()
                    .collect();
                for id in p.gone.clone() {
                    p.index.condemn(id);
                    p.packs.remove(&id);
                }
                p.replaced = files.into_iter().map(|(n, _)| n).collect();
                p.step = PStep::Adopt;
            }
            // Packs in no index, older than the grace period by the storage's clock.
            PStep::Adopt => {
                let Some(survey) = self.survey(a) else {
                    return self.refuse(a, "own session file missing");
                };
                self.prune(a).floor = survey
                    .others
                    .iter()
                    .filter_map(|(v, _)| v.info.observed)
                    .max()
                    .unwrap_or(0);
                let p = self.prune_ref(a);
                let adopted: Vec<(u64, Vec<u32>)> = self
                    .st
                    .packs
                    .live()
                    .filter(|(id, _)| {
                        !p.index.knows_pack(*id)
                            && !p.trash.packs.contains_key(id)
                            && p.stored
                                .get(id)
                                .is_some_and(|t| survey.now.saturating_sub(*t) > GRACE)
                    })
                    .map(|(id, blobs)| (id, blobs.clone()))
                    .collect();
                let file = self.write_index(adopted.clone());
                let p = self.prune(a);
                p.replaced.extend(file);
                for (id, blobs) in adopted {
                    p.index.add_pack(id, &blobs);
                    p.packs.insert(id, blobs);
                }
                p.unindexed = p
                    .stored
                    .keys()
                    .filter(|id| !p.packs.contains_key(id) && !p.trash.packs.contains_key(id))
                    .count();
                p.step = PStep::Condemn;
            }
            PStep::Condemn => {
                let p = self.prune_ref(a);
                let needed_in = |blob: u32, pack: u64| {
                    p.used.contains(&blob) && p.index.get(blob) == Some(pack)
                };
                let newly: Vec<u64> = p
                    .packs
                    .iter()
                    .filter(|(id, _)| !p.trash.packs.contains_key(id))
                    .filter(|(id, blobs)| !blobs.iter().any(|b| needed_in(*b, **id)))
                    .map(|(id, _)| *id)
                    .collect();
                if !newly.is_empty() {
                    let mut trash = std::mem::take(&mut self.prune(a).trash);
                    if self.rules.recheck_before_writing {
                        self.beat(a);
                        if self.lost(a) {
                            self.prune(a).trash = trash;
                            return self.refuse(a, "paused before condemning");
                        }
                    }
                    let floor = self.prune_ref(a).floor;
                    let g = self.condemn(&mut trash, &newly, floor);
                    self.log(|| format!("actor {a}: condemns {newly:x?} in generation {g}"));
                    let p = self.prune(a);
                    p.trash = trash;
                    for id in newly {
                        p.index.condemn(id);
                    }
                }
                self.prune(a).step = PStep::Decide;
            }
            PStep::Decide => {
                self.beat(a);
                let Some(survey) = self.survey(a) else {
                    return self.refuse(a, "own session file missing");
                };
                if self.lost(a) {
                    return self.refuse(a, "paused too long");
                }
                let now = self.st.now;
                let mut new_snapshots = Vec::new();
                for (name, _) in self.st.snapshots.list(now, now, &mut self.rng) {
                    if self.prune_ref(a).snapshots.contains(&name) {
                        continue;
                    }
                    // Removed since it was listed: it needs nothing.
                    let Some(blobs) = self.st.snapshots.get(name) else {
                        continue;
                    };
                    new_snapshots.extend(blobs.iter().copied());
                }
                let mut new_files = Vec::new();
                for (name, _) in self.st.index.list(now, now, &mut self.rng) {
                    if self.prune_ref(a).replaced.contains(&name) {
                        continue;
                    }
                    let Some(file) = self.st.index.get(name) else {
                        return self.refuse(a, "an index file is damaged");
                    };
                    new_files.push(file.clone());
                }
                let (rules, trace) = (self.rules, self.trace);
                let p = self.prune(a);
                for (id, blobs) in new_files.iter().flatten() {
                    p.index.add_pack(*id, blobs);
                }
                p.used.extend(new_snapshots);
                let live: Vec<&View> = survey
                    .others
                    .iter()
                    .filter(|(_, s)| *s == Standing::Live)
                    .map(|(v, _)| v)
                    .collect();
                let mut condemned: Vec<(u64, u64)> =
                    p.trash.packs.iter().map(|(p, g)| (*p, *g)).collect();
                condemned.sort_unstable();
                let current = p.trash.generation;
                for (id, generation) in condemned {
                    // Generation 0 (found missing by a backup): waits like one condemned now.
                    let generation = match generation {
                        0 => current,
                        g => g,
                    };
                    if !p.stored.contains_key(&id) {
                        p.deletable.push(id);
                        continue;
                    }
                    let only_copy = p.packs.get(&id).is_some_and(|blobs| {
                        blobs
                            .iter()
                            .any(|b| p.used.contains(b) && !p.index.contains_live(*b))
                    });
                    if only_copy {
                        p.rescued.insert(id);
                        continue;
                    }
                    let blocked = rules.observed_generations
                        && live
                            .iter()
                            .any(|v| !may_delete(generation, v.info.observed));
                    match blocked {
                        true => {
                            p.deferred.insert(id);
                        }
                        false => p.deletable.push(id),
                    }
                }
                let seen: Vec<String> = survey
                    .others
                    .iter()
                    .filter(|_| trace)
                    .map(|(v, st)| format!("{} {:?} observed {:?}", v.info.id, st, v.info.observed))
                    .collect();
                p.survey = Some(survey);
                self.log(|| format!("actor {a}: sessions {seen:?}"));
                let p = self.prune(a);
                let (d, r, f) = (p.deletable.clone(), p.rescued.clone(), p.deferred.clone());
                self.log(|| format!("actor {a}: deletes {d:x?}, rescues {r:x?}, defers {f:x?}"));
                self.prune(a).step = PStep::WriteIndex;
            }
            PStep::WriteIndex => {
                if self.rules.recheck_before_writing {
                    self.beat(a);
                    if self.lost(a) {
                        return self.refuse(a, "paused since its decisions");
                    }
                }
                let p = self.prune_ref(a);
                if !p.deletable.is_empty() || !p.gone.is_empty() {
                    let keep: IndexFile = p
                        .packs
                        .iter()
                        .filter(|(id, _)| !p.deletable.contains(id))
                        .map(|(id, blobs)| (*id, blobs.clone()))
                        .collect();
                    let replaced = p.replaced.clone();
                    self.write_index(keep);
                    for name in replaced {
                        delete(&mut self.st.index, &mut self.st.now, &mut self.rng, name);
                    }
                }
                self.prune(a).step = PStep::Delete;
            }
            PStep::Delete => {
                for id in self.prune_ref(a).deletable.clone() {
                    self.st.delete_pack(&mut self.rng, id);
                }
                self.prune(a).step = PStep::Trash;
            }
            PStep::Trash => {
                let p = self.prune_ref(a);
                if !p.deletable.is_empty() || !p.rescued.is_empty() {
                    let current = p.trash.generation;
                    let mut remaining: Vec<(u64, u64)> = p
                        .trash
                        .packs
                        .iter()
                        .filter(|(id, _)| p.deferred.contains(id))
                        .map(|(id, g)| (*id, if *g == 0 { current } else { *g }))
                        .collect();
                    if self.rules.recheck_before_writing {
                        self.beat(a);
                        if self.lost(a) {
                            return self.refuse(a, "paused before rewriting the trash");
                        }
                    }
                    remaining.sort_unstable();
                    let mut trash = std::mem::take(&mut self.prune(a).trash);
                    let generation = trash.generation;
                    self.replace_trash(&mut trash, generation, remaining);
                    self.prune(a).trash = trash;
                }
                self.prune(a).step = PStep::Finish;
            }
            PStep::Finish => {
                let p = self.prune_ref(a);
                if p.unindexed == 0 {
                    let ended: Vec<u64> = p
                        .survey
                        .as_ref()
                        .expect("surveyed")
                        .others
                        .iter()
                        .filter(|(_, s)| *s != Standing::Live)
                        .flat_map(|(v, _)| v.files.clone())
                        .collect();
                    for name in ended {
                        delete(&mut self.st.sessions, &mut self.st.now, &mut self.rng, name);
                    }
                }
                self.finish_session(a);
                return Outcome::Exit;
            }
        }
        Outcome::Continue
    }

    pub(super) fn prune_ref(&self, a: usize) -> &Prune {
        match &self.actors[a].job {
            Job::Prune(p) => p,
            Job::Backup(_) => unreachable!("a prune"),
        }
    }
}
