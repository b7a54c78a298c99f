//! The fleet's router: which replica serves each request (DESIGN §10).
//!
//! In: every arrival (its prompt tokens, session and lengths), the replicas' exported load
//! ([`Load`]: waiting requests, running sequences, KV usage), refreshed every
//! `cluster.refresh_ms`, and the ends of requests. Out: a [`Decision`] per request, the
//! replica and the scores that chose it, which the driver delivers and `routes.csv` records.
//!
//! [`Router`] is the pure core (time passed in, decisions returned); `actor.rs` is its actix
//! shell. What it knows comes in two kinds, as in a real gateway: its own counts of the
//! requests and tokens it has sent and not yet seen end are always current; what the
//! engines export (their queues, KV usage) is a snapshot, as old as the last refresh. One
//! policy per file, behind [`RoutingPolicy`], chosen by `cluster.routing`.

mod actor;
mod least_outstanding;
mod power_of_two;
mod prefix_aware;
mod prefix_index;
mod random;
mod round_robin;
mod session_affinity;
mod shortest_queue;

pub use actor::{Ended, Handoff, Refresh, Route, RouterActor};
pub use prefix_index::PrefixIndex;

use engine::request::{Nanos, Request, SeqId};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rustc_hash::FxHashMap;

use crate::scenario::cluster::{ClusterConfig, Role, RoutingKind};

/// What a replica exports (vLLM's `num_requests_waiting`, `num_requests_running` and
/// `kv_cache_usage_perc` gauges), as the router last read it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Load {
    /// Requests waiting to be admitted.
    pub waiting: u32,
    /// Sequences running.
    pub running: u32,
    /// KV blocks in use / pool blocks.
    pub kv_usage: f64,
}

/// The router's view of one replica.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ReplicaView {
    /// The last refreshed export.
    pub load: Load,
    /// Requests sent there and not yet ended (the router's own, current count).
    pub outstanding: u32,
    /// Their prompt + output tokens.
    pub outstanding_tokens: u64,
}

/// The scores behind a decision, where the policy computes them (each in [0, 1]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Scores {
    /// Estimated fraction of the prompt's leading blocks the replica caches.
    pub prefix: Option<f64>,
    /// The queue scorer's score.
    pub queue: Option<f64>,
    /// The KV-utilisation scorer's score.
    pub kv: Option<f64>,
    /// The weighted mean the replica won with.
    pub total: Option<f64>,
}

/// A policy's pick.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    /// Index of the replica.
    pub replica: usize,
    /// Its scores.
    pub scores: Scores,
}

impl Choice {
    /// A pick without scores.
    pub fn of(replica: usize) -> Self {
        Choice {
            replica,
            scores: Scores::default(),
        }
    }
}

/// A routing policy: picks a replica for a request from the router's views. It may keep
/// state of its own (a cursor, an index of prefixes, sessions), updated as it picks.
pub trait RoutingPolicy: Send {
    /// The replica for `req`; `views` has one entry per replica (never empty).
    fn choose(&mut self, req: &Request, views: &[ReplicaView], rng: &mut ChaCha8Rng) -> Choice;
}

/// The policy a scenario names (`cluster.routing`).
pub fn policy(cfg: &ClusterConfig, replicas: usize) -> Box<dyn RoutingPolicy> {
    policy_of(cfg.routing, cfg, replicas)
}

/// Policy `kind` over `replicas`, with `cfg`'s scorers and prefix index.
fn policy_of(kind: RoutingKind, cfg: &ClusterConfig, replicas: usize) -> Box<dyn RoutingPolicy> {
    match kind {
        RoutingKind::RoundRobin => Box::new(round_robin::RoundRobin::default()),
        RoutingKind::Random => Box::new(random::Random),
        RoutingKind::LeastOutstanding => Box::new(least_outstanding::LeastOutstanding),
        RoutingKind::ShortestQueue => Box::new(shortest_queue::ShortestQueue),
        RoutingKind::PowerOfTwo => Box::new(power_of_two::PowerOfTwo),
        RoutingKind::SessionAffinity => Box::new(session_affinity::SessionAffinity::default()),
        RoutingKind::PrefixAware => Box::new(prefix_aware::PrefixAware::new(
            cfg.scorers,
            PrefixIndex::new(cfg.prefix_index, replicas),
        )),
    }
}

/// The index of the smallest key, ties broken at random (so equal replicas share the load
/// rather than the first taking it all); `None` for no keys.
pub fn argmin_random<K: PartialOrd + Copy>(
    keys: impl Iterator<Item = K>,
    rng: &mut ChaCha8Rng,
) -> Option<usize> {
    let mut best: Option<(K, usize)> = None;
    let mut ties = 0u32;
    for (i, k) in keys.enumerate() {
        match best {
            Some((b, _)) if k > b => {}
            Some((b, _)) if k == b => {
                // Reservoir sampling over the ties: the i-th tie replaces with chance 1/i.
                ties += 1;
                if rng.random_range(0..ties) == 0 {
                    best = Some((k, i));
                }
            }
            _ => {
                best = Some((k, i));
                ties = 1;
            }
        }
    }
    best.map(|(_, i)| i)
}

/// One routing decision, as `routes.csv` records it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// The request.
    pub request: SeqId,
    /// When it was routed.
    pub time: Nanos,
    /// The replica it went to (a prefill replica when disaggregated).
    pub replica: usize,
    /// Prefill/decode disaggregation: the decode replica its KV goes to after the prefill.
    pub decode: Option<usize>,
    /// The scores that chose it.
    pub scores: Scores,
    /// The replica's requests in flight before this one.
    pub outstanding: u32,
    /// Age of the replica's exported load the decision saw.
    pub view_age_ns: Nanos,
}

/// Errors of the router's bookkeeping (each a broken invariant, not a user error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouterError {
    /// A request ended that was never routed, or ended twice.
    #[error("router: request {0} ended but is not in flight (never routed, or ended twice)")]
    NotInFlight(SeqId),
    /// A request ended on another replica than the one it was sent to.
    #[error("router: request {id} was sent to replica {routed} but ended on replica {ended}")]
    WrongReplica {
        /// The request.
        id: SeqId,
        /// Where it was routed.
        routed: usize,
        /// Where it ended.
        ended: usize,
    },
    /// A request was routed twice.
    #[error("router: request {0} routed twice")]
    RoutedTwice(SeqId),
    /// Requests still counted in flight when every request had ended.
    #[error("router: {0} requests still in flight after the run ended")]
    LeftInFlight(usize),
}

/// A stage of routing: the replicas it picks from and its own policy (with its own state).
struct Stage {
    policy: Box<dyn RoutingPolicy>,
    /// Indices of the replicas (all of them: `None`).
    members: Option<Vec<usize>>,
}

impl Stage {
    /// The stage's pick for `req`, as a replica index of the fleet.
    fn pick(
        &mut self,
        req: &Request,
        views: &[ReplicaView],
        scratch: &mut Vec<ReplicaView>,
        rng: &mut ChaCha8Rng,
    ) -> Choice {
        let Some(members) = &self.members else {
            return self.policy.choose(req, views, rng);
        };
        scratch.clear();
        scratch.extend(members.iter().map(|&i| views[i]));
        let c = self.policy.choose(req, scratch, rng);
        Choice {
            replica: members[c.replica.min(members.len() - 1)],
            ..c
        }
    }
}

/// The router core.
pub struct Router {
    /// The first stage: every replica, or the prefill replicas when disaggregated.
    first: Stage,
    /// Disaggregated: the decode replicas' stage.
    decode: Option<Stage>,
    /// Disaggregated: prompts shorter than this go to a decode replica whole.
    min_prompt: u32,
    /// Disaggregated: prompts with fewer uncached tokens on their decode replica than
    /// this, by `decider`'s estimate, go to it whole.
    min_uncached: u32,
    /// The decider's index of what each decode replica caches (with `min_uncached`).
    decider: Option<PrefixIndex>,
    decider_matched: Vec<u32>,
    scratch: Vec<ReplicaView>,
    views: Vec<ReplicaView>,
    rng: ChaCha8Rng,
    refresh_ns: Nanos,
    refreshed_at: Nanos,
    /// In flight: request -> (replica, tokens).
    inflight: FxHashMap<SeqId, (usize, u64)>,
}

impl Router {
    /// A router over replicas of these roles, as `cfg` says, its random draws seeded by
    /// `seed`. With prefill and decode replicas, a request goes first to a prefill replica
    /// and then to a decode replica, each picked by its own instance of the policy (the
    /// decode stage's own, `cluster.disaggregation.decode_routing`, where set).
    pub fn new(cfg: &ClusterConfig, roles: &[Role], seed: u64) -> Self {
        let replicas = roles.len().max(1);
        let of = |r: Role| -> Vec<usize> { (0..roles.len()).filter(|&i| roles[i] == r).collect() };
        let (prefill, decode) = (of(Role::Prefill), of(Role::Decode));
        let disaggregated = !prefill.is_empty() && !decode.is_empty();
        let (first, decode) = if disaggregated {
            (
                Stage {
                    policy: policy(cfg, prefill.len()),
                    members: Some(prefill),
                },
                Some(Stage {
                    policy: policy_of(
                        cfg.disaggregation.decode_routing.unwrap_or(cfg.routing),
                        cfg,
                        decode.len(),
                    ),
                    members: Some(decode),
                }),
            )
        } else {
            (
                Stage {
                    policy: policy(cfg, replicas),
                    members: None,
                },
                None,
            )
        };
        Router {
            first,
            decode,
            min_prompt: cfg.disaggregation.min_prompt,
            min_uncached: cfg.disaggregation.min_uncached,
            decider: (cfg.disaggregation.min_uncached > 0)
                .then(|| PrefixIndex::new(cfg.prefix_index, replicas)),
            decider_matched: Vec::new(),
            scratch: Vec::new(),
            views: vec![ReplicaView::default(); replicas],
            rng: crate::workload::stream(seed, 0x5_0000),
            refresh_ns: (cfg.refresh_ms * 1e6).round() as Nanos,
            refreshed_at: 0,
            inflight: FxHashMap::default(),
        }
    }

    /// How often the exported loads are read (0: before every decision).
    pub fn refresh_ns(&self) -> Nanos {
        self.refresh_ns
    }

    /// The exported loads as of `now`, one per replica.
    pub fn refresh(&mut self, loads: &[Load], now: Nanos) {
        for (v, l) in self.views.iter_mut().zip(loads) {
            v.load = *l;
        }
        self.refreshed_at = now;
    }

    /// Routes `req` at `now`; it counts as in flight on the chosen replica until
    /// [`Router::ended`].
    pub fn route(&mut self, req: &Request, now: Nanos) -> Result<Decision, RouterError> {
        let (views, scratch, rng) = (&self.views, &mut self.scratch, &mut self.rng);
        let (choice, decode) = match (self.decode.as_mut(), self.decider.as_mut()) {
            (None, _) => (self.first.pick(req, views, scratch, rng), None),
            // A short prompt runs whole on a decode replica (which then caches it).
            (Some(d), decider) if req.prompt_len < self.min_prompt => {
                let dc = d.pick(req, views, scratch, rng);
                if let Some(index) = decider {
                    index.insert(dc.replica, &index.hashes(req));
                }
                (dc, None)
            }
            (Some(d), None) => {
                let p = self.first.pick(req, views, scratch, rng);
                (p, Some(d.pick(req, views, scratch, rng).replica))
            }
            // The decode replica first: if its cache is believed to hold all but a short
            // suffix of the prompt, it prefills the rest itself.
            (Some(d), Some(index)) => {
                let dc = d.pick(req, views, scratch, rng);
                let hashes = index.hashes(req);
                self.decider_matched.resize(views.len(), 0);
                index.matches(&hashes, &mut self.decider_matched);
                let cached = self.decider_matched[dc.replica] * index.block_size();
                index.insert(dc.replica, &hashes);
                if req.prompt_len.saturating_sub(cached) < self.min_uncached {
                    (dc, None)
                } else {
                    let p = self.first.pick(req, views, scratch, rng);
                    (p, Some(dc.replica))
                }
            }
        };
        let replica = choice.replica.min(self.views.len() - 1);
        let tokens =
            u64::from(req.prompt_len) + u64::from(req.max_tokens) * u64::from(req.n.max(1));
        if self.inflight.insert(req.id, (replica, tokens)).is_some() {
            return Err(RouterError::RoutedTwice(req.id));
        }
        let v = &mut self.views[replica];
        let outstanding = v.outstanding;
        v.outstanding += 1;
        v.outstanding_tokens += tokens;
        Ok(Decision {
            request: req.id,
            time: now,
            replica,
            decode,
            scores: choice.scores,
            outstanding,
            view_age_ns: now.saturating_sub(self.refreshed_at),
        })
    }

    /// Request `id` ended on `replica`.
    pub fn ended(&mut self, id: SeqId, replica: usize) -> Result<(), RouterError> {
        let &(routed, tokens) = self.inflight.get(&id).ok_or(RouterError::NotInFlight(id))?;
        if routed != replica {
            return Err(RouterError::WrongReplica {
                id,
                routed,
                ended: replica,
            });
        }
        self.inflight.remove(&id);
        let v = &mut self.views[routed];
        v.outstanding -= 1;
        v.outstanding_tokens -= tokens;
        Ok(())
    }

    /// Request `id`'s prefill ended on `from`: it is now in flight on the decode replica
    /// `to` (its KV on the way).
    pub fn handoff(&mut self, id: SeqId, from: usize, to: usize) -> Result<(), RouterError> {
        let entry = self
            .inflight
            .get_mut(&id)
            .ok_or(RouterError::NotInFlight(id))?;
        if entry.0 != from {
            return Err(RouterError::WrongReplica {
                id,
                routed: entry.0,
                ended: from,
            });
        }
        let tokens = entry.1;
        entry.0 = to;
        let v = &mut self.views[from];
        v.outstanding -= 1;
        v.outstanding_tokens -= tokens;
        let v = &mut self.views[to];
        v.outstanding += 1;
        v.outstanding_tokens += tokens;
        Ok(())
    }

    /// Requests routed and not yet ended.
    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// The current views (for tests).
    pub fn views(&self) -> &[ReplicaView] {
        &self.views
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(routing: RoutingKind) -> ClusterConfig {
        let mut c: ClusterConfig =
            toml::from_str("routing = \"round-robin\"\n[pools.a]\nreplicas = 4\n").unwrap();
        c.routing = routing;
        c
    }

    #[test]
    fn round_robin_cycles_and_counts_in_flight() {
        let mut r = Router::new(&cfg(RoutingKind::RoundRobin), &[Role::Mixed; 3], 1);
        let picks: Vec<usize> = (0..6)
            .map(|i| r.route(&Request::new(i, 0, 10, 5), 0).unwrap().replica)
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        assert_eq!(r.views()[0].outstanding, 2);
        assert_eq!(r.views()[0].outstanding_tokens, 30);
        r.ended(0, 0).unwrap();
        assert_eq!(r.views()[0].outstanding, 1);
        assert_eq!(r.ended(0, 0), Err(RouterError::NotInFlight(0)));
        assert!(matches!(
            r.ended(1, 2),
            Err(RouterError::WrongReplica { .. })
        ));
        assert_eq!(r.in_flight(), 5);
    }

    /// Uniform draws, whatever the load: over 4,000 requests each of 4 replicas gets its
    /// quarter within 5 standard deviations (sqrt(4000 x 1/4 x 3/4) = 27), and the same seed
    /// draws the same replicas.
    #[test]
    fn random_spreads_uniformly_and_repeats_with_its_seed() {
        let picks = |seed| {
            let mut r = Router::new(&cfg(RoutingKind::Random), &[Role::Mixed; 4], seed);
            (0..4000)
                .map(|i| r.route(&Request::new(i, 0, 10, 5), 0).unwrap().replica)
                .collect::<Vec<_>>()
        };
        let a = picks(7);
        for k in 0..4 {
            let n = a.iter().filter(|&&x| x == k).count() as f64;
            assert!((n - 1000.0).abs() < 5.0 * 27.4, "replica {k}: {n}");
        }
        assert_eq!(a, picks(7));
        assert_ne!(a, picks(8));
    }

    #[test]
    fn least_outstanding_fills_the_emptiest() {
        let mut r = Router::new(&cfg(RoutingKind::LeastOutstanding), &[Role::Mixed; 3], 1);
        for i in 0..3 {
            r.route(&Request::new(i, 0, 10, 5), 0).unwrap();
        }
        // One each; end the request on replica whichever got id 1: it is picked next.
        let d = r.views().iter().map(|v| v.outstanding).collect::<Vec<_>>();
        assert_eq!(d, [1, 1, 1]);
        let on = (0..3).find(|&k| r.ended(1, k).is_ok()).unwrap();
        assert_eq!(r.route(&Request::new(9, 0, 10, 5), 0).unwrap().replica, on);
    }

    #[test]
    fn shortest_queue_weighs_tokens() {
        let mut r = Router::new(&cfg(RoutingKind::ShortestQueue), &[Role::Mixed; 2], 1);
        let a = r.route(&Request::new(0, 0, 1000, 10), 0).unwrap().replica;
        // The long prompt's replica is avoided by the next three short ones.
        for i in 1..4 {
            assert_ne!(r.route(&Request::new(i, 0, 10, 10), 0).unwrap().replica, a);
        }
    }

    #[test]
    fn session_affinity_keeps_a_conversation() {
        let mut r = Router::new(&cfg(RoutingKind::SessionAffinity), &[Role::Mixed; 4], 1);
        let req = |id: u64, session: u64| Request {
            session,
            ..Request::new(id, 0, 10, 5)
        };
        let first = r.route(&req(0, 7), 0).unwrap().replica;
        for i in 1..10 {
            r.route(&req(i, 100 + i), 0).unwrap();
        }
        assert_eq!(r.route(&req(20, 7), 0).unwrap().replica, first);
    }

    #[test]
    fn prefix_aware_follows_the_prefix_and_reports_scores() {
        let mut c = cfg(RoutingKind::PrefixAware);
        c.prefix_index.block_size = 4;
        let mut r = Router::new(&c, &[Role::Mixed; 4], 1);
        let tokens: Vec<u32> = (0..64).collect();
        let first = r
            .route(&Request::new(0, 0, 1, 5).with_tokens(tokens.clone()), 0)
            .unwrap();
        assert_eq!(first.scores.prefix, Some(0.0));
        // Same loads everywhere (no refresh): the prefix decides.
        let mut longer = tokens.clone();
        longer.extend(100..120);
        let d = r
            .route(&Request::new(1, 0, 1, 5).with_tokens(longer), 0)
            .unwrap();
        assert_eq!(d.replica, first.replica);
        assert_eq!(d.scores.prefix, Some(16.0 / 21.0));
        // A loaded replica loses against the prefix only when the load outweighs it.
        let mut loads = vec![Load::default(); 4];
        loads[first.replica] = Load {
            waiting: 50,
            running: 10,
            kv_usage: 1.0,
        };
        r.refresh(&loads, 1_000);
        let d = r
            .route(&Request::new(2, 2_000, 1, 5).with_tokens(tokens), 2_000)
            .unwrap();
        assert_ne!(d.replica, first.replica, "prefix 3 < queue 2 + kv 2");
        assert_eq!(d.view_age_ns, 1_000);
    }

    #[test]
    fn disaggregated_requests_pick_a_prefill_then_a_decode_replica() {
        let mut c = cfg(RoutingKind::RoundRobin);
        c.disaggregation.min_prompt = 100;
        let roles = [Role::Decode, Role::Prefill, Role::Decode, Role::Prefill];
        let mut r = Router::new(&c, &roles, 1);
        let d = r.route(&Request::new(0, 0, 500, 5), 0).unwrap();
        assert_eq!((d.replica, d.decode), (1, Some(0)));
        let d = r.route(&Request::new(1, 0, 500, 5), 0).unwrap();
        assert_eq!((d.replica, d.decode), (3, Some(2)));
        // A short prompt runs whole on a decode replica (the decode stage's turn).
        let d = r.route(&Request::new(2, 0, 50, 5), 0).unwrap();
        assert_eq!((d.replica, d.decode), (0, None));
        assert_eq!(r.views()[1].outstanding, 1);
        r.handoff(0, 1, 0).unwrap();
        assert_eq!((r.views()[1].outstanding, r.views()[0].outstanding), (0, 2));
        assert!(r.handoff(0, 1, 0).is_err(), "already handed off");
        r.ended(0, 0).unwrap();
        assert_eq!(r.in_flight(), 2);
    }

    /// `decode_routing` gives the decode stage its own policy: prefill replicas drawn at
    /// random (both get some of 200 requests, in no fixed order) while decode replicas
    /// still alternate.
    #[test]
    fn the_decode_stage_may_route_by_its_own_policy() {
        let mut c = cfg(RoutingKind::Random);
        c.disaggregation.decode_routing = Some(RoutingKind::RoundRobin);
        let roles = [Role::Prefill, Role::Prefill, Role::Decode, Role::Decode];
        let mut r = Router::new(&c, &roles, 3);
        let picks: Vec<(usize, Option<usize>)> = (0..200)
            .map(|i| {
                let d = r.route(&Request::new(i, 0, 500, 5), 0).unwrap();
                (d.replica, d.decode)
            })
            .collect();
        let decodes: Vec<usize> = picks.iter().map(|p| p.1.unwrap()).collect();
        assert!(decodes.chunks(2).all(|c| c == [2, 3]), "decode in turn");
        let firsts = picks.iter().filter(|p| p.0 == 0).count();
        assert!(
            (60..140).contains(&firsts),
            "prefill at random: {firsts} of 200 on 0"
        );
        let alternating = picks.windows(2).all(|w| w[0].0 != w[1].0);
        assert!(!alternating, "prefill replicas not in turn");
    }

    #[test]
    fn the_decider_keeps_mostly_cached_prompts_on_their_decode_replica() {
        let mut c = cfg(RoutingKind::RoundRobin);
        c.disaggregation.min_uncached = 100;
        c.prefix_index.block_size = 16;
        let roles = [Role::Prefill, Role::Decode];
        let mut r = Router::new(&c, &roles, 1);
        let first: Vec<u32> = (0..512).collect();
        let d = r
            .route(&Request::new(0, 0, 1, 5).with_tokens(first.clone()), 0)
            .unwrap();
        assert_eq!(
            (d.replica, d.decode),
            (0, Some(1)),
            "nothing cached: disaggregated"
        );
        // The next turn adds 40 tokens: 512 are cached on the decode replica.
        let mut next = first.clone();
        next.extend(1000..1040);
        let d = r
            .route(&Request::new(1, 0, 1, 5).with_tokens(next), 0)
            .unwrap();
        assert_eq!(
            (d.replica, d.decode),
            (1, None),
            "40 uncached < 100: run whole"
        );
        // A new prompt is disaggregated again.
        let other: Vec<u32> = (5000..5600).collect();
        let d = r
            .route(&Request::new(2, 0, 1, 5).with_tokens(other), 0)
            .unwrap();
        assert_eq!(d.decode, Some(1));
    }

    #[test]
    fn ties_are_shared() {
        let mut rng = crate::workload::stream(3, 1);
        let mut seen = [0u32; 4];
        for _ in 0..400 {
            seen[argmin_random([1, 1, 1, 1].into_iter(), &mut rng).unwrap()] += 1;
        }
        assert!(seen.iter().all(|&n| n > 60), "{seen:?}");
        assert_eq!(argmin_random([3, 1, 2].into_iter(), &mut rng), Some(1));
        assert_eq!(argmin_random(std::iter::empty::<u32>(), &mut rng), None);
    }
}
