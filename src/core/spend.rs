//! What a run has spent, from the usage its steps reported: the canonical measures summed
//! over the run as llm-runner/v1 sums usage (each measure over the steps that reported it,
//! absent until one does, a lower bound once a step left it out), the steps that left a
//! measure unreported, and the cost at the run's frozen catalog prices, in exact integer
//! arithmetic.
//!
//! A *metered step* is a completed model step, or a failed attempt the provider had begun to
//! answer (it may have been billed). An attempt refused before any answer (an error status)
//! was not billed and is not counted. A metered step that did not report its input or its
//! output count is *unmeasured*: the run's totals of that measure are then a lower bound, and
//! a budget that needs it stops the run (`budget_unmeasured`) rather than run on unmetered.
//!
//! Cost: each price (per million tokens) is taken as an integer count of micro-units per
//! million tokens (the price times 10^6, rounded); a step costs
//! `uncached × input + cache_read × cache_read_price + cache_write × cache_write_price +
//! output × output_price`, kept in units of 10^-6 micro-units and summed exactly over the
//! run; the cost in micro-units is that sum divided by 10^6, rounded up (never under). The
//! uncached input is the total input less the cache counts. A tier applies to a step whose
//! total input is above its threshold. A cache read the catalog has no price for is charged
//! at the input price (an upper bound); a cache write without a price cannot be priced.

use broca_protocol::Usage;
use broca_wal::runrec::CatalogPrices;

/// A session's consumed input, the measure of its input-token cap (llm-runner/v1
/// `budget.max_input_tokens`): each completed model step's total input (uncached, cache reads
/// and cache writes at face value) over every run of the session. Once a step has not
/// reported its input the sum cannot be measured: it stays what the steps before it
/// consumed, and a capped run takes no further step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InputTally {
    pub spent: u64,
    pub unmeasured: bool,
}

impl InputTally {
    /// Counts a completed step's reported usage.
    pub fn add(&mut self, usage: &Usage) {
        if self.unmeasured {
            return;
        }
        match usage.input {
            Some(input) => self.spent = self.spent.saturating_add(input),
            None => self.unmeasured = true,
        }
    }
}

/// A metered step that reported not every measure a budget needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unmeasured {
    pub step: u32,
    pub attempt: u32,
    /// `input`, `output`, or `input and output`.
    pub missing: &'static str,
}

/// A metered step the frozen prices cannot price.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unpriced {
    pub step: u32,
    /// The measure without a price (`input`, `output`, `cache_write`), or `prices` when the
    /// entry has none.
    pub measure: &'static str,
}

/// A run's spend so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spend {
    /// Each measure summed over the metered steps that reported it; absent until one did.
    usage: Usage,
    /// Metered steps counted.
    metered: u32,
    /// Metered steps that reported no measure at all.
    unreported: u32,
    /// Metered steps that did not report input or output.
    unmeasured: u32,
    first_unmeasured: Option<Unmeasured>,
    /// The cost so far in 10^-6 micro-units (while every metered step could be priced).
    cost_e6: u128,
    unpriced: Option<Unpriced>,
}

impl Spend {
    /// Counts a metered step (`usage` as it reported; `None` when it reported nothing),
    /// priced at `prices`.
    pub fn add(
        &mut self,
        step: u32,
        attempt: u32,
        usage: Option<&Usage>,
        prices: Option<&CatalogPrices>,
    ) {
        let u = usage.copied().unwrap_or_default();
        self.usage = self.usage.add(&u);
        self.metered += 1;
        if u == Usage::default() {
            self.unreported += 1;
        }
        assert!(
            self.unmeasured < self.metered,
            "a step is counted before it is judged"
        );
        let missing = match (u.input, u.output) {
            (Some(_), Some(_)) => None,
            (None, Some(_)) => Some("input"),
            (Some(_), None) => Some("output"),
            (None, None) => Some("input and output"),
        };
        if let Some(missing) = missing {
            self.unmeasured += 1;
            assert!(
                self.unmeasured <= self.metered,
                "only metered steps go unmeasured"
            );
            self.first_unmeasured.get_or_insert(Unmeasured {
                step,
                attempt,
                missing,
            });
            return;
        }
        assert_eq!(
            self.unmeasured == 0,
            self.first_unmeasured.is_none(),
            "the first unmeasured step is named once there is one"
        );
        if self.unpriced.is_some() {
            return;
        }
        match step_cost_e6(&u, prices) {
            Ok(c) => self.cost_e6 = self.cost_e6.saturating_add(c),
            Err(measure) => self.unpriced = Some(Unpriced { step, measure }),
        }
    }

    /// The run's totals: each measure summed over the metered steps that reported it (absent
    /// until one did; a lower bound when some step left it out).
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// How many metered steps reported no measure at all.
    pub fn unreported_steps(&self) -> u32 {
        self.unreported
    }

    /// How many metered steps did not report input or output.
    pub fn unmeasured_steps(&self) -> u32 {
        self.unmeasured
    }

    /// The first of them.
    pub fn first_unmeasured(&self) -> Option<Unmeasured> {
        self.first_unmeasured
    }

    /// The first metered step the prices could not price.
    pub fn unpriced(&self) -> Option<Unpriced> {
        self.unpriced
    }

    /// Input plus output tokens over the run, when every metered step reported both (0
    /// before any).
    pub fn tokens(&self) -> Option<u64> {
        if self.unmeasured > 0 {
            return None;
        }
        if self.metered == 0 {
            return Some(0);
        }
        Some(self.usage.input?.saturating_add(self.usage.output?))
    }

    /// The cost over the run in micro-units (rounded up), when every metered step was
    /// measured and priced (0 before any).
    pub fn cost_micros(&self) -> Option<u64> {
        if self.unmeasured > 0 || self.unpriced.is_some() {
            return None;
        }
        Some(u64::try_from(self.cost_e6.div_ceil(1_000_000)).unwrap_or(u64::MAX))
    }
}

/// A price per million tokens as micro-units per million tokens.
fn micros(price: f64) -> u128 {
    // Prices are checked finite and non-negative where a catalog is read.
    (price * 1e6).round().max(0.0) as u128
}

/// The rates (micro-units per million tokens) that apply to a step of `input` total tokens.
struct Rates {
    input: Option<f64>,
    output: Option<f64>,
    cache_read: Option<f64>,
    cache_write: Option<f64>,
}

fn rates(prices: &CatalogPrices, input: u64) -> Rates {
    let mut r = Rates {
        input: prices.input,
        output: prices.output,
        cache_read: prices.cache_read,
        cache_write: prices.cache_write,
    };
    if let Some(t) = prices
        .tiers
        .iter()
        .rev()
        .find(|t| input > t.above_input_tokens)
    {
        r.input = t.input.or(r.input);
        r.output = t.output.or(r.output);
        r.cache_read = t.cache_read.or(r.cache_read);
        r.cache_write = t.cache_write.or(r.cache_write);
    }
    r
}

/// The cost of one measured step in 10^-6 micro-units, or the measure without a price.
fn step_cost_e6(u: &Usage, prices: Option<&CatalogPrices>) -> Result<u128, &'static str> {
    let prices = prices.ok_or("prices")?;
    let (input, output) = (u.input.unwrap_or(0), u.output.unwrap_or(0));
    let r = rates(prices, input);
    let input_rate = micros(r.input.ok_or("input")?);
    let output_rate = micros(r.output.ok_or("output")?);
    let read = u.cache_read.unwrap_or(0);
    let write = u.cache_write.unwrap_or(0);
    let write_rate = match r.cache_write {
        Some(p) => micros(p),
        None if write > 0 => return Err("cache_write"),
        None => 0,
    };
    let read_rate = r.cache_read.map_or(input_rate, micros);
    let uncached = input.saturating_sub(read.saturating_add(write));
    assert!(uncached <= input, "the uncached input is part of the input");
    Ok(uncached as u128 * input_rate
        + read as u128 * read_rate
        + write as u128 * write_rate
        + output as u128 * output_rate)
}

/// The least a request of `input` total tokens can cost at `prices`, in micro-units
/// (rounded down): every input token at the cheapest input rate. `None` without prices.
pub fn least_input_cost_micros(prices: Option<&CatalogPrices>, input: u64) -> Option<u64> {
    let r = rates(prices?, input);
    let input_rate = micros(r.input?);
    let cheapest = r
        .cache_read
        .map_or(input_rate, |p| micros(p).min(input_rate));
    assert!(
        cheapest <= input_rate,
        "the cheapest rate is no dearer than input's"
    );
    Some(u64::try_from(input as u128 * cheapest / 1_000_000).unwrap_or(u64::MAX))
}

/// One completed step's usage as the role counts it: `input_tokens` only the input neither
/// read from nor written to a cache (broca's canonical input holds all three), and a step
/// that reported no measure at all unreported.
pub fn step_usage(u: &Usage) -> cortexkit_role_llm_runner::usage::StepUsage {
    let mut s = cortexkit_role_llm_runner::usage::StepUsage::unreported();
    if let Some(input) = u.input {
        let cached = u.cache_read.unwrap_or(0) + u.cache_write.unwrap_or(0);
        s = s.with_input_tokens(input.saturating_sub(cached));
    }
    if let Some(n) = u.cache_read {
        s = s.with_cached_input_tokens(n);
    }
    if let Some(n) = u.cache_write {
        s = s.with_cache_write_tokens(n);
    }
    if let Some(n) = u.output {
        s = s.with_output_tokens(n);
    }
    if let Some(n) = u.reasoning {
        s = s.with_reasoning_tokens(n);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use broca_wal::runrec::CatalogPriceTier;

    fn prices() -> CatalogPrices {
        CatalogPrices {
            currency: "USD".into(),
            unit: "per_million_tokens".into(),
            input: Some(3.0),
            output: Some(15.0),
            cache_read: Some(0.3),
            cache_write: Some(3.75),
            tiers: Vec::new(),
        }
    }

    fn usage(input: u64, output: u64) -> Usage {
        Usage {
            input: Some(input),
            output: Some(output),
            ..Usage::default()
        }
    }

    #[test]
    fn costs_are_exact_integer_micro_units_rounded_up_over_the_run() {
        let p = prices();
        let mut s = Spend::default();
        // 1 input token at 3 USD per million is 3 micro-USD; 1 output token 15.
        s.add(1, 1, Some(&usage(1, 1)), Some(&p));
        assert_eq!(s.cost_micros(), Some(18));
        // Cached input at its own rates: 1000 total = 100 uncached + 800 read + 100 written.
        let cached = Usage {
            cache_read: Some(800),
            cache_write: Some(100),
            ..usage(1000, 0)
        };
        s.add(2, 1, Some(&cached), Some(&p));
        // 100*3 + 800*0.3 + 100*3.75 = 300 + 240 + 375 = 915 micro-USD.
        assert_eq!(s.cost_micros(), Some(18 + 915));
        // Fractions are kept exactly and rounded once: 7 tokens at 0.3 = 2.1 micro-USD.
        let mut t = Spend::default();
        let read_only = Usage {
            cache_read: Some(7),
            ..usage(7, 0)
        };
        t.add(1, 1, Some(&read_only), Some(&p));
        t.add(2, 1, Some(&read_only), Some(&p));
        assert_eq!(t.cost_micros(), Some(5), "4.2 micro-USD rounds up to 5");
        assert_eq!(t.tokens(), Some(14));
    }

    #[test]
    fn a_tier_prices_a_step_above_its_threshold() {
        let mut p = prices();
        p.tiers = vec![CatalogPriceTier {
            above_input_tokens: 200_000,
            input: Some(6.0),
            output: None,
            cache_read: None,
            cache_write: None,
        }];
        let mut s = Spend::default();
        s.add(1, 1, Some(&usage(200_000, 0)), Some(&p));
        assert_eq!(
            s.cost_micros(),
            Some(600_000),
            "at the threshold: base price"
        );
        s.add(2, 1, Some(&usage(200_001, 1)), Some(&p));
        // Above: 6 per million for input, output at the base 15.
        assert_eq!(s.cost_micros(), Some(600_000 + 1_200_006 + 15));
    }

    #[test]
    fn an_unreported_measure_makes_the_total_a_lower_bound_and_is_named() {
        let p = prices();
        let mut s = Spend::default();
        s.add(1, 1, Some(&usage(10, 5)), Some(&p));
        s.add(2, 1, None, Some(&p));
        s.add(
            3,
            1,
            Some(&Usage {
                input: Some(4),
                ..Usage::default()
            }),
            Some(&p),
        );
        // Each total sums the steps that reported it (step 2 reported nothing, step 3 no
        // output); a measure no step reported stays absent, never 0.
        assert_eq!(s.usage().input, Some(14));
        assert_eq!(s.usage().output, Some(5));
        assert_eq!(s.usage().cache_read, None);
        assert_eq!(s.unmeasured_steps(), 2);
        assert_eq!(
            s.unreported_steps(),
            1,
            "only step 2 reported nothing at all"
        );
        assert_eq!(
            s.first_unmeasured(),
            Some(Unmeasured {
                step: 2,
                attempt: 1,
                missing: "input and output"
            })
        );
        assert_eq!(s.tokens(), None);
        assert_eq!(s.cost_micros(), None);
    }

    #[test]
    fn what_the_prices_lack_makes_the_cost_unknown() {
        let mut p = prices();
        p.cache_write = None;
        let mut s = Spend::default();
        s.add(1, 1, Some(&usage(10, 5)), Some(&p));
        assert!(
            s.cost_micros().is_some(),
            "no cache write, nothing unpriced"
        );
        let written = Usage {
            cache_write: Some(3),
            ..usage(10, 5)
        };
        s.add(2, 1, Some(&written), Some(&p));
        assert_eq!(s.cost_micros(), None);
        assert_eq!(
            s.unpriced(),
            Some(Unpriced {
                step: 2,
                measure: "cache_write"
            })
        );
        let mut none = Spend::default();
        none.add(1, 1, Some(&usage(1, 1)), None);
        assert_eq!(none.unpriced().map(|u| u.measure), Some("prices"));
        assert_eq!(Spend::default().cost_micros(), Some(0));
    }

    #[test]
    fn the_least_a_request_costs_uses_the_cheapest_input_rate() {
        let p = prices();
        assert_eq!(least_input_cost_micros(Some(&p), 1_000_000), Some(300_000));
        assert_eq!(least_input_cost_micros(None, 10), None);
    }
}
