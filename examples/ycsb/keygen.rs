//! What the driver asks for: a seeded PRNG, fixed-width keys scrambled over the key space,
//! the key distributions YCSB uses (uniform, Zipf by Gray et al., latest, hotspot) and the
//! operation mixes of the workloads.
//!
//! Record `i` (0-based, in insertion order) has the key `prefix ‖ be64(scramble(i))`, where
//! `scramble` is a bijection on `u64`. The distributions pick *indexes*; the scramble then
//! spreads them over the key space, so the Zipf-hot records (small indexes) do not all sit in
//! one leaf page, as YCSB's "scrambled Zipfian" does.

use std::sync::atomic::{AtomicU64, Ordering};

use clap::ValueEnum;

/// xoshiro256**, seeded through splitmix64: fast, small state, good enough statistics for
/// choosing keys and operations (not for cryptography).
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

/// One step of splitmix64: advances `state` and returns a well-mixed word.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator whose sequence depends only on `seed`.
    pub fn new(seed: u64) -> Rng {
        let mut state = seed;
        let s = [
            splitmix64(&mut state),
            splitmix64(&mut state),
            splitmix64(&mut state),
            splitmix64(&mut state),
        ];
        Rng { s }
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[0, n)` (Lemire's multiply-shift; the bias is below 2^-64 · n).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// A bijection on `u64` (the splitmix64 finalizer after an offset): every step is
/// invertible, so distinct indexes give distinct keys.
pub fn scramble(index: u64) -> u64 {
    let mut z = index.wrapping_add(0x6A09_E667_F3BC_C909);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// How record indexes map to keys (YCSB's `insertorder`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum InsertOrder {
    /// Keys scrambled over the key space: the load inserts in random key order.
    #[default]
    Hashed,
    /// Keys in index order: the load inserts in ascending key order (a sorted bulk load),
    /// and the records a distribution makes hot are neighbours.
    Ordered,
}

/// Writes the key of record `index` into `out` (`out.len()` is the key width, at least 8):
/// a constant `user000…` prefix, as YCSB's keys have, then the index big-endian,
/// scrambled unless `order` is `Ordered`.
pub fn key_into(order: InsertOrder, index: u64, out: &mut [u8]) {
    debug_assert!(out.len() >= 8, "keys are at least 8 bytes");
    let split = out.len() - 8;
    for (i, b) in out[..split].iter_mut().enumerate() {
        *b = if i < 4 { b"user"[i] } else { b'0' };
    }
    let n = match order {
        InsertOrder::Hashed => scramble(index),
        InsertOrder::Ordered => index,
    };
    out[split..].copy_from_slice(&n.to_be_bytes());
}

/// Fills `out` with a value for record `index`, version `version`: cheap and different per
/// write, so an engine cannot deduplicate it.
pub fn value_into(index: u64, version: u64, out: &mut [u8]) {
    let mut state = index ^ version.rotate_left(32);
    for chunk in out.chunks_mut(8) {
        let w = splitmix64(&mut state).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

/// Key distributions (YCSB's request distributions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Distribution {
    /// Every existing record equally likely.
    Uniform,
    /// Zipf with exponent `--theta` over the loaded records (rank 0 hottest).
    Zipf,
    /// Zipf over recency: the most recently inserted records are hottest.
    Latest,
    /// A hot set (`--hot-set-fraction` of the records) takes `--hot-op-fraction` of the
    /// operations; the rest go uniformly to the cold records.
    Hotspot,
}

/// Zipf-distributed ranks in `[0, n)` by the method of Gray et al. ("Quickly generating
/// billion-record synthetic databases", SIGMOD 1994), as YCSB's `ZipfianGenerator` does.
#[derive(Clone, Debug)]
pub struct Zipf {
    n: u64,
    alpha: f64,
    zeta_n: f64,
    eta: f64,
    half_pow_theta: f64,
}

/// Terms summed exactly before the tail of ζ(n, θ) is approximated by an integral.
const ZETA_EXACT_TERMS: u64 = 1 << 20;

/// ζ(n, θ) = Σ_{i=1..n} i^-θ. The first 2^20 terms are summed; the rest by the
/// Euler–Maclaurin integral with its first correction, accurate to ~1e-9 relative there,
/// so ten-billion-record key spaces cost milliseconds.
pub fn zeta(n: u64, theta: f64) -> f64 {
    let exact = n.min(ZETA_EXACT_TERMS);
    let mut sum = 0.0;
    for i in 1..=exact {
        sum += (i as f64).powf(-theta);
    }
    if n > exact {
        let (a, b) = (exact as f64, n as f64);
        let integral = (b.powf(1.0 - theta) - a.powf(1.0 - theta)) / (1.0 - theta);
        // Σ_{i=a+1..b} f(i) ≈ ∫_a^b f + (f(b) - f(a)) / 2.
        sum += integral + (b.powf(-theta) - a.powf(-theta)) / 2.0;
    }
    sum
}

impl Zipf {
    /// A generator over `[0, n)`; `theta` must lie in (0, 1).
    pub fn new(n: u64, theta: f64) -> Result<Zipf, String> {
        if n == 0 {
            return Err("a Zipf distribution needs at least one item".into());
        }
        if !(theta > 0.0 && theta < 1.0) {
            return Err(format!(
                "--theta must lie strictly between 0 and 1, not {theta}"
            ));
        }
        let zeta_n = zeta(n, theta);
        let zeta_2 = 1.0 + 0.5f64.powf(theta);
        let eta = (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta_2 / zeta_n);
        Ok(Zipf {
            n,
            alpha: 1.0 / (1.0 - theta),
            zeta_n,
            eta,
            half_pow_theta: 0.5f64.powf(theta),
        })
    }

    /// A rank in `[0, n)`; rank 0 is the most frequent.
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        let u = rng.next_f64();
        let uz = u * self.zeta_n;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + self.half_pow_theta {
            return 1.min(self.n - 1);
        }
        let rank = (self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        rank.min(self.n - 1)
    }
}

/// Parameters of the hotspot distribution.
#[derive(Clone, Copy, Debug)]
pub struct Hotspot {
    pub hot_set_fraction: f64,
    pub hot_op_fraction: f64,
}

/// Picks record indexes for one thread. Shares the count of existing records (which grows
/// with inserts) with the other threads.
pub struct Chooser<'a> {
    distribution: Distribution,
    zipf: &'a Zipf,
    hotspot: Hotspot,
    existing: &'a AtomicU64,
}

impl<'a> Chooser<'a> {
    pub fn new(
        distribution: Distribution,
        zipf: &'a Zipf,
        hotspot: Hotspot,
        existing: &'a AtomicU64,
    ) -> Chooser<'a> {
        Chooser {
            distribution,
            zipf,
            hotspot,
            existing,
        }
    }

    /// The index of an existing record.
    pub fn existing_index(&self, rng: &mut Rng) -> u64 {
        let n = self.existing.load(Ordering::Relaxed).max(1);
        match self.distribution {
            Distribution::Uniform => rng.below(n),
            Distribution::Zipf => self.zipf.sample(rng).min(n - 1),
            Distribution::Latest => n - 1 - self.zipf.sample(rng).min(n - 1),
            Distribution::Hotspot => {
                let hot = ((n as f64 * self.hotspot.hot_set_fraction) as u64).clamp(1, n);
                if hot == n || rng.next_f64() < self.hotspot.hot_op_fraction {
                    rng.below(hot)
                } else {
                    hot + rng.below(n - hot)
                }
            }
        }
    }

    /// Claims the index of a new record; it counts as existing once the claim returns
    /// (YCSB's acknowledged-insert window is not modelled: a read may race its insert).
    pub fn new_index(&self) -> u64 {
        self.existing.fetch_add(1, Ordering::Relaxed)
    }
}

/// The workloads: YCSB's core workloads A–F and single-operation ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// 50% reads, 50% updates (YCSB A, "update heavy").
    A,
    /// 95% reads, 5% updates (YCSB B).
    B,
    /// 100% reads (YCSB C).
    C,
    /// 95% reads, 5% inserts; reads follow the latest distribution (YCSB D).
    D,
    /// 95% scans, 5% inserts (YCSB E).
    E,
    /// 50% reads, 50% read-modify-writes (YCSB F).
    F,
    /// Point reads only.
    Read,
    /// Blind updates of existing records only.
    Update,
    /// Inserts of new records only.
    Insert,
    /// Scans of `--scan-length` records only.
    Scan,
    /// 50% point reads, 50% blind updates: the "50/50 mix" of the targets.
    Mix,
}

/// Percentages of each operation in a workload; they add up to 100.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpMix {
    pub read: u8,
    pub update: u8,
    pub insert: u8,
    pub scan: u8,
    pub read_modify_write: u8,
}

/// One operation of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Update,
    Insert,
    Scan,
    ReadModifyWrite,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::A => "a",
            Workload::B => "b",
            Workload::C => "c",
            Workload::D => "d",
            Workload::E => "e",
            Workload::F => "f",
            Workload::Read => "read",
            Workload::Update => "update",
            Workload::Insert => "insert",
            Workload::Scan => "scan",
            Workload::Mix => "mix",
        }
    }

    pub fn mix(self) -> OpMix {
        let m = OpMix::default();
        match self {
            Workload::A | Workload::Mix => OpMix {
                read: 50,
                update: 50,
                ..m
            },
            Workload::B => OpMix {
                read: 95,
                update: 5,
                ..m
            },
            Workload::C | Workload::Read => OpMix { read: 100, ..m },
            Workload::D => OpMix {
                read: 95,
                insert: 5,
                ..m
            },
            Workload::E => OpMix {
                scan: 95,
                insert: 5,
                ..m
            },
            Workload::F => OpMix {
                read: 50,
                read_modify_write: 50,
                ..m
            },
            Workload::Update => OpMix { update: 100, ..m },
            Workload::Insert => OpMix { insert: 100, ..m },
            Workload::Scan => OpMix { scan: 100, ..m },
        }
    }

    /// The distribution the workload's reads use: D always reads the latest records, as in
    /// YCSB; the others use the one asked for.
    pub fn distribution(self, asked: Distribution) -> Distribution {
        if self == Workload::D {
            Distribution::Latest
        } else {
            asked
        }
    }
}

impl OpMix {
    /// Draws the next operation.
    pub fn pick(&self, rng: &mut Rng) -> Op {
        let mut x = rng.below(100) as u8;
        for (share, op) in [
            (self.read, Op::Read),
            (self.update, Op::Update),
            (self.insert, Op::Insert),
            (self.scan, Op::Scan),
            (self.read_modify_write, Op::ReadModifyWrite),
        ] {
            if x < share {
                return op;
            }
            x -= share;
        }
        unreachable!("the shares of an OpMix add up to 100")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scramble_is_injective_on_a_range_and_spreads_neighbours() {
        let mut seen: Vec<u64> = (0..100_000).map(scramble).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 100_000);
        // Neighbouring indexes land far apart in the key space.
        let far = (0..1000u64)
            .filter(|&i| scramble(i).abs_diff(scramble(i + 1)) > 1 << 40)
            .count();
        assert!(far > 990, "only {far} of 1000 neighbours were spread");
    }

    #[test]
    fn keys_are_fixed_width_and_ordered_by_scrambled_index() {
        let mut a = [0u8; 16];
        let mut b = [0u8; 16];
        key_into(InsertOrder::Hashed, 1, &mut a);
        key_into(InsertOrder::Hashed, 2, &mut b);
        assert_eq!(&a[..8], b"user0000");
        assert_eq!(a[..8], b[..8]);
        assert_eq!(a.cmp(&b), scramble(1).cmp(&scramble(2)));
        let mut k8 = [0u8; 8];
        key_into(InsertOrder::Hashed, 7, &mut k8);
        assert_eq!(k8, scramble(7).to_be_bytes());
        // Ordered: index order is key order.
        key_into(InsertOrder::Ordered, 255, &mut a);
        key_into(InsertOrder::Ordered, 256, &mut b);
        assert!(a < b);
        assert_eq!(a[8..], 255u64.to_be_bytes());
    }

    #[test]
    fn zeta_tail_approximation_matches_the_exact_sum() {
        let n = ZETA_EXACT_TERMS * 3;
        let exact: f64 = (1..=n).map(|i| (i as f64).powf(-0.9)).sum();
        let approx = zeta(n, 0.9);
        assert!((exact - approx).abs() / exact < 1e-9, "{exact} vs {approx}");
    }

    #[test]
    fn zipf_frequencies_follow_the_power_law() {
        let n = 1000;
        let zipf = Zipf::new(n, 0.9).unwrap();
        let mut rng = Rng::new(42);
        let mut counts = vec![0u64; n as usize];
        let draws = 2_000_000;
        for _ in 0..draws {
            counts[zipf.sample(&mut rng) as usize] += 1;
        }
        let zeta_n = zeta(n, 0.9);
        // Ranks 0 and 1 are exact in Gray's method; later ranks are approximate but close.
        for rank in [0usize, 1, 9, 99] {
            let expected = draws as f64 * ((rank + 1) as f64).powf(-0.9) / zeta_n;
            let got = counts[rank] as f64;
            assert!(
                (got - expected).abs() / expected < 0.2,
                "rank {rank}: {got} draws, expected about {expected}"
            );
        }
        assert!(counts[0] > counts[10] && counts[10] > counts[500]);
    }

    #[test]
    fn zipf_rejects_bad_parameters() {
        assert!(Zipf::new(0, 0.9).is_err());
        assert!(Zipf::new(10, 1.0).is_err());
        assert!(Zipf::new(10, 0.0).is_err());
        assert!(Zipf::new(1, 0.5).is_ok());
    }

    #[test]
    fn choosers_stay_in_range() {
        let existing = AtomicU64::new(10_000);
        let zipf = Zipf::new(10_000, 0.99).unwrap();
        let hot = Hotspot {
            hot_set_fraction: 0.2,
            hot_op_fraction: 0.8,
        };
        let mut rng = Rng::new(7);
        for d in Distribution::value_variants() {
            let chooser = Chooser::new(*d, &zipf, hot, &existing);
            let (mut hot_hits, mut newest_hits) = (0, 0);
            for _ in 0..10_000 {
                let i = chooser.existing_index(&mut rng);
                assert!(i < 10_000, "{d:?} chose {i}");
                hot_hits += (i < 2000) as u32;
                newest_hits += (i >= 8000) as u32;
            }
            match d {
                Distribution::Hotspot => assert!((7500..8500).contains(&hot_hits), "{hot_hits}"),
                Distribution::Zipf => assert!(hot_hits > 5000, "{hot_hits}"),
                // Latest favours the newest (highest) indexes.
                Distribution::Latest => assert!(newest_hits > 5000, "{newest_hits}"),
                Distribution::Uniform => assert!((1700..2300).contains(&hot_hits), "{hot_hits}"),
            }
        }
        let chooser = Chooser::new(Distribution::Uniform, &zipf, hot, &existing);
        assert_eq!(chooser.new_index(), 10_000);
        assert_eq!(existing.load(Ordering::Relaxed), 10_001);
    }

    #[test]
    fn op_mixes_add_up_and_pick_their_shares() {
        let mut rng = Rng::new(3);
        for w in Workload::value_variants() {
            let m = w.mix();
            let total = m.read + m.update + m.insert + m.scan + m.read_modify_write;
            assert_eq!(total, 100, "{w:?}");
            for _ in 0..100 {
                m.pick(&mut rng);
            }
        }
        let b = Workload::B.mix();
        let updates = (0..100_000)
            .filter(|_| b.pick(&mut rng) == Op::Update)
            .count();
        assert!((4000..6000).contains(&updates), "{updates}");
    }

    #[test]
    fn rng_is_seeded_and_below_is_in_range() {
        let (mut a, mut b) = (Rng::new(9), Rng::new(9));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        for _ in 0..10_000 {
            assert!(a.below(17) < 17);
            let f = a.next_f64();
            assert!((0.0..1.0).contains(&f));
        }
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }
}
