//! `[cluster]`: a fleet of engine replicas behind a router (DESIGN §10).
//!
//! In: the `[cluster]` table of a scenario (or variant): the routing policy, how stale the
//! router's view of the replicas is (`refresh_ms`), the prefix-aware scorers' weights, and
//! `[cluster.pools.<name>]` tables, each a number of replicas and the scenario tables it
//! overrides (`model`, `hardware`, `engine`, `cost`, `speculative`), so pools may differ in
//! GPU, parallelism or engine settings. Out: [`Fleet`], every pool resolved like a variant
//! (deployment, memory plan, scheduler limits), which `run` turns into one engine per
//! replica. Without `[cluster]` a scenario is one engine, as before.
//!
//! ```toml
//! [cluster]
//! routing = "prefix-aware"
//! refresh_ms = 50
//! [cluster.pools.h100]
//! replicas = 8
//! [cluster.pools.a100]
//! replicas = 4
//! hardware = { gpu = "a100-80gb" }
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Variant;

/// Most replicas a fleet may have: every replica holds its own pools and counters, so the
/// bound keeps a typo (`replicas = 1000000`) from exhausting memory before anything runs.
pub const MAX_REPLICAS: u32 = 4096;

/// The router's policy (`cluster.routing`); each is one file under `sim/router/`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RoutingKind {
    /// Replicas in turn (Vidur's and Kubernetes Services' default).
    #[default]
    RoundRobin,
    /// A replica drawn uniformly at random (Vidur's `random`; SGLang's attention-DP ranks
    /// in prefill/decode disaggregation, chosen by a random bootstrap room).
    Random,
    /// Fewest requests in flight (the router's own count; Vidur's `lor`).
    LeastOutstanding,
    /// Join the shortest queue by tokens: fewest prompt + output tokens in flight.
    ShortestQueue,
    /// Two replicas drawn at random, the one with fewer requests in flight (Mitzenmacher).
    PowerOfTwo,
    /// A conversation stays on the replica that served its first turn (a session header);
    /// requests without a session go to the least outstanding.
    SessionAffinity,
    /// llm-d's weighted scorers: estimated prefix-cache hit, queue depth, KV utilisation.
    PrefixAware,
}

impl RoutingKind {
    /// The name the scenario uses.
    pub fn as_str(self) -> &'static str {
        match self {
            RoutingKind::RoundRobin => "round-robin",
            RoutingKind::Random => "random",
            RoutingKind::LeastOutstanding => "least-outstanding",
            RoutingKind::ShortestQueue => "shortest-queue",
            RoutingKind::PowerOfTwo => "power-of-two",
            RoutingKind::SessionAffinity => "session-affinity",
            RoutingKind::PrefixAware => "prefix-aware",
        }
    }
}

/// `[cluster.scorers]`: weights of the prefix-aware policy's scorers; each scorer gives a
/// replica a score in [0, 1] and the replica with the highest weighted mean wins. The
/// defaults are llm-d's inference-scheduling guide (prefix 3, queue 2, KV utilisation 2).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScorerWeights {
    /// The prompt's leading blocks the replica is estimated to hold, as a fraction.
    #[serde(default = "default_prefix_weight")]
    pub prefix: f64,
    /// Waiting requests, min-max normalised over the replicas (fewest: 1).
    #[serde(default = "default_load_weight")]
    pub queue: f64,
    /// 1 - KV-cache usage.
    #[serde(default = "default_load_weight")]
    pub kv: f64,
    /// Requests in flight by the router's own count, min-max normalised (not in llm-d's
    /// defaults: 0; it is fresh where the others are refreshed every `refresh_ms`).
    #[serde(default)]
    pub outstanding: f64,
}

fn default_prefix_weight() -> f64 {
    3.0
}
fn default_load_weight() -> f64 {
    2.0
}

impl Default for ScorerWeights {
    fn default() -> Self {
        ScorerWeights {
            prefix: default_prefix_weight(),
            queue: default_load_weight(),
            kv: default_load_weight(),
            outstanding: 0.0,
        }
    }
}

/// `[cluster.prefix_index]`: the router's estimate of what each replica caches (llm-d's
/// approximate prefix-cache scorer): the blocks of the prompts it sent there, hashed in
/// blocks of its own size, an LRU of bounded size per replica. It never sees evictions, so
/// it can be wrong, as the real one is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixIndexConfig {
    /// Tokens per hashed block (llm-d: 64).
    #[serde(default = "default_index_block")]
    pub block_size: u32,
    /// Blocks remembered per replica (llm-d: 31,250).
    #[serde(default = "default_index_capacity")]
    pub blocks_per_replica: u32,
    /// Leading blocks of a prompt looked up at most (llm-d: 256).
    #[serde(default = "default_index_max_blocks")]
    pub max_blocks: u32,
}

fn default_index_block() -> u32 {
    64
}
fn default_index_capacity() -> u32 {
    31_250
}
fn default_index_max_blocks() -> u32 {
    256
}

impl Default for PrefixIndexConfig {
    fn default() -> Self {
        PrefixIndexConfig {
            block_size: default_index_block(),
            blocks_per_replica: default_index_capacity(),
            max_blocks: default_index_max_blocks(),
        }
    }
}

/// What a pool's replicas do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Whole requests, prefill and decode (colocated).
    #[default]
    Mixed,
    /// Prompts only: the KV goes to a decode replica (prefill/decode disaggregation).
    Prefill,
    /// Decoding of prompts prefilled elsewhere (and whole short requests).
    Decode,
}

impl Role {
    /// The name the scenario uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Mixed => "mixed",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// How KV moves from a prefill replica to a decode replica.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Link {
    /// Across nodes: GPUDirect RDMA over the GPUs' scale-out network (NIXL, Mooncake's
    /// transfer engine).
    #[default]
    Rdma,
    /// Inside one node: the GPUs' NVLink.
    Nvlink,
}

/// `[cluster.disaggregation]`: prefill/decode disaggregation (pools with `role = "prefill"`
/// and `role = "decode"`). A prompt of at least `min_prompt` tokens is prefilled on a
/// prefill replica (as vLLM's disaggregated proxy does it: `max_tokens = 1`, its KV held
/// until sent); its KV then moves over the link, each GPU's shard over its own link, in
/// `bytes / bandwidth + latency`, and a decode replica admits it with that KV computed.
/// Shorter prompts run whole on a decode replica, and so do prompts of which fewer than
/// `min_uncached` tokens are estimated missing from the chosen decode replica's cache
/// (llm-d's P/D threshold on the non-cached suffix).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisaggregationConfig {
    /// Prompts shorter than this run whole on a decode replica (0: every prompt is
    /// disaggregated).
    #[serde(default)]
    pub min_prompt: u32,
    /// Prompts whose uncached part on the decode replica is shorter than this run whole
    /// there (0: not asked). The estimate is the router's own index of the prompts it sent
    /// to each decode replica (`[cluster.prefix_index]`'s block size and capacity).
    #[serde(default)]
    pub min_uncached: u32,
    /// The link KV moves over.
    #[serde(default)]
    pub link: Link,
    /// Bandwidth per GPU, GB/s (default: the GPUs' scale-out network bandwidth over RDMA,
    /// their NVLink bandwidth over NVLink, from the catalog; the slower of the two pools').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_gbs: Option<f64>,
    /// Fixed cost of a transfer (connection set-up, completion notice), microseconds.
    #[serde(default = "default_latency_us")]
    pub latency_us: f64,
    /// The decode stage's routing policy (default: `cluster.routing`, as for the prefill
    /// stage): engines may pick the two differently (SGLang's prefill ranks by a random
    /// bootstrap room, its decode ranks in turn under `--load-balance-method auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_routing: Option<RoutingKind>,
}

fn default_latency_us() -> f64 {
    10.0
}

impl Default for DisaggregationConfig {
    fn default() -> Self {
        DisaggregationConfig {
            min_prompt: 0,
            min_uncached: 0,
            link: Link::Rdma,
            bandwidth_gbs: None,
            latency_us: default_latency_us(),
            decode_routing: None,
        }
    }
}

/// `[cluster]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// The router's policy.
    #[serde(default)]
    pub routing: RoutingKind,
    /// How often the router's view of replica state (waiting requests, KV usage) is
    /// refreshed, ms (llm-d scrapes every 50 ms); 0: a fresh view at every decision. The
    /// router's own counts of what it sent are always current.
    #[serde(default = "default_refresh_ms")]
    pub refresh_ms: f64,
    /// The prefix-aware policy's weights.
    #[serde(default)]
    pub scorers: ScorerWeights,
    /// The prefix-aware policy's index of cached blocks.
    #[serde(default)]
    pub prefix_index: PrefixIndexConfig,
    /// Price of one GPU-hour, for the fleet's cost per million tokens (a pool may set its
    /// own); default: the GPU catalog's rough on-demand figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd_per_gpu_hour: Option<f64>,
    /// Prefill/decode disaggregation's link and decider (used with prefill and decode
    /// pools).
    #[serde(default)]
    pub disaggregation: DisaggregationConfig,
    /// The pools, by name (results name replicas `<pool>-<i>`).
    pub pools: BTreeMap<String, PoolConfig>,
}

fn default_refresh_ms() -> f64 {
    50.0
}

/// `[cluster.pools.<name>]`: identical replicas; the tables given override the scenario's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Replicas in the pool.
    pub replicas: u32,
    /// What its replicas do (`mixed`, `prefill`, `decode`).
    #[serde(default)]
    pub role: Role,
    /// Price of one GPU-hour of this pool (default: the cluster's, else the catalog's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd_per_gpu_hour: Option<f64>,
    /// `[model]` keys of this pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<toml::Table>,
    /// `[hardware]` keys of this pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<toml::Table>,
    /// `[engine]` keys of this pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<toml::Table>,
    /// `[cost]` keys of this pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<toml::Table>,
    /// `[speculative]` keys of this pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculative: Option<toml::Table>,
}

impl PoolConfig {
    /// The scenario tables this pool overrides, by key.
    pub fn overrides(&self) -> impl Iterator<Item = (&'static str, &toml::Table)> {
        [
            ("model", &self.model),
            ("hardware", &self.hardware),
            ("engine", &self.engine),
            ("cost", &self.cost),
            ("speculative", &self.speculative),
        ]
        .into_iter()
        .filter_map(|(k, t)| t.as_ref().map(|t| (k, t)))
    }
}

impl ClusterConfig {
    /// Checks the values serde cannot: counts, rates and weights in range.
    pub fn validate(&self) -> Result<(), String> {
        if self.pools.is_empty() {
            return Err(
                "cluster.pools: give at least one pool ([cluster.pools.<name>] replicas = N)"
                    .into(),
            );
        }
        if !(self.refresh_ms.is_finite() && self.refresh_ms >= 0.0) {
            return Err(format!(
                "cluster.refresh_ms: must be a finite number >= 0, got {}",
                self.refresh_ms
            ));
        }
        let w = &self.scorers;
        for (k, v) in [
            ("prefix", w.prefix),
            ("queue", w.queue),
            ("kv", w.kv),
            ("outstanding", w.outstanding),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!(
                    "cluster.scorers.{k}: must be a finite weight >= 0, got {v}"
                ));
            }
        }
        if w.prefix + w.queue + w.kv + w.outstanding <= 0.0 {
            return Err("cluster.scorers: at least one weight must be above 0".into());
        }
        let p = &self.prefix_index;
        for (k, v, max) in [
            ("block_size", p.block_size, 1 << 20),
            ("blocks_per_replica", p.blocks_per_replica, 1 << 24),
            ("max_blocks", p.max_blocks, 1 << 20),
        ] {
            if v == 0 || v > max {
                return Err(format!(
                    "cluster.prefix_index.{k}: must be between 1 and {max}, got {v}"
                ));
            }
        }
        check_price("cluster.usd_per_gpu_hour", self.usd_per_gpu_hour)?;
        let d = &self.disaggregation;
        if let Some(bw) = d.bandwidth_gbs {
            if !(bw.is_finite() && bw > 0.0) {
                return Err(format!(
                    "cluster.disaggregation.bandwidth_gbs: must be a finite number > 0, got {bw}"
                ));
            }
        }
        if !(d.latency_us.is_finite() && d.latency_us >= 0.0) {
            return Err(format!(
                "cluster.disaggregation.latency_us: must be a finite number >= 0, got {}",
                d.latency_us
            ));
        }
        let has = |r: Role| self.pools.values().any(|p| p.role == r);
        let (pre, dec, mixed) = (has(Role::Prefill), has(Role::Decode), has(Role::Mixed));
        if (pre || dec) && !(pre && dec) {
            return Err(format!(
                "cluster.pools: prefill/decode disaggregation needs a pool with role = \"prefill\" and one with role = \"decode\" (found only {})",
                if pre { "prefill" } else { "decode" }
            ));
        }
        if pre && mixed {
            return Err("cluster.pools: mix either colocated pools (role = \"mixed\") or prefill and decode pools, not both".into());
        }
        let mut total = 0u64;
        for (name, pool) in &self.pools {
            let key = format!("cluster.pools.{name}");
            super::check_folder_name(&key, name)?;
            if pool.replicas == 0 || pool.replicas > MAX_REPLICAS {
                return Err(format!(
                    "{key}.replicas: must be between 1 and {MAX_REPLICAS}, got {}",
                    pool.replicas
                ));
            }
            total += u64::from(pool.replicas);
            check_price(&format!("{key}.usd_per_gpu_hour"), pool.usd_per_gpu_hour)?;
        }
        if total > u64::from(MAX_REPLICAS) {
            return Err(format!(
                "cluster.pools: {total} replicas in all, more than the {MAX_REPLICAS} a fleet may have"
            ));
        }
        Ok(())
    }
}

fn check_price(key: &str, v: Option<f64>) -> Result<(), String> {
    match v {
        Some(p) if !(p.is_finite() && p >= 0.0) => {
            Err(format!("{key}: must be a finite price >= 0, got {p}"))
        }
        _ => Ok(()),
    }
}

/// A resolved pool: its replicas' configuration, checked like a variant.
#[derive(Debug, Clone)]
pub struct Pool {
    /// The pool's name.
    pub name: String,
    /// Replicas.
    pub replicas: u32,
    /// Attention data-parallel ranks per replica (`hardware.dp`; 1: none): each rank is an
    /// engine of the fleet.
    pub ranks: u32,
    /// Price of one GPU-hour: the pool's, the cluster's, or the GPU catalog's rough
    /// on-demand figure.
    pub usd_per_gpu_hour: f64,
    /// What its replicas do.
    pub role: Role,
    /// Every replica's configuration, deployment, memory plan and limits.
    pub engine: Box<Variant>,
}

impl Pool {
    /// GPUs one engine (a replica, or one of its attention-DP ranks) uses.
    pub fn gpus_per_engine(&self) -> u32 {
        let d = &self.engine.deployment;
        d.tp.max(1) * d.pp.max(1)
    }

    /// Engines of the pool: replicas x ranks.
    pub fn engines(&self) -> u32 {
        self.replicas * self.ranks.max(1)
    }

    /// GPUs of the pool.
    pub fn gpus(&self) -> u32 {
        self.engines() * self.gpus_per_engine()
    }

    /// The name of engine `i`: `<pool>-<replica>`, or `<pool>-<replica>.<rank>` under
    /// attention data parallelism.
    pub fn engine_name(&self, i: u32) -> String {
        match self.ranks {
            0 | 1 => format!("{}-{i}", self.name),
            r => format!("{}-{}.{}", self.name, i / r, i % r),
        }
    }
}

/// A resolved `[cluster]`: the router's settings and the pools, in name order.
#[derive(Debug, Clone)]
pub struct Fleet {
    /// The `[cluster]` table as given.
    pub config: ClusterConfig,
    /// The pools.
    pub pools: Vec<Pool>,
}

impl Fleet {
    /// Whether requests are disaggregated (prefill and decode pools).
    pub fn disaggregated(&self) -> bool {
        self.pools.iter().any(|p| p.role == Role::Prefill)
    }

    /// The role of every replica, pool by pool.
    pub fn replica_roles(&self) -> Vec<Role> {
        self.pools
            .iter()
            .flat_map(|p| std::iter::repeat_n(p.role, p.engines() as usize))
            .collect()
    }

    /// A transfer's link bandwidth per GPU (bytes/s) and latency (ns) between the pools
    /// of replicas `from` and `to` (their GPUs' NVLink over NVLink: the slower).
    pub fn link(&self, from: &Pool, to: &Pool) -> (f64, u64) {
        let d = &self.config.disaggregation;
        let (f, t) = (&from.engine.deployment.gpu, &to.engine.deployment.gpu);
        let bw = match (d.bandwidth_gbs, d.link) {
            (Some(gbs), _) => gbs * 1e9,
            (None, Link::Rdma) => f.network_bw.min(t.network_bw),
            (None, Link::Nvlink) => f.link_bw.min(t.link_bw),
        };
        (bw, (d.latency_us * 1e3).round() as u64)
    }

    /// Every engine's lockstep group, pool by pool: the attention-DP ranks of one replica
    /// share one (they step together); each other engine has its own.
    pub fn lockstep_groups(&self) -> Vec<usize> {
        let mut out = Vec::new();
        let mut next = 0;
        for p in &self.pools {
            let ranks = p.ranks.max(1);
            for e in 0..p.engines() {
                out.push(next + (e / ranks) as usize);
            }
            next += p.replicas as usize;
        }
        out
    }

    /// `(pool index, engine name)` of every engine, pool by pool.
    pub fn replica_names(&self) -> Vec<(usize, String)> {
        self.pools
            .iter()
            .enumerate()
            .flat_map(|(i, p)| (0..p.engines()).map(move |e| (i, p.engine_name(e))))
            .collect()
    }
}
