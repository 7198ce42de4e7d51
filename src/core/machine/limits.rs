//! The stop conditions a run checks before each model request: its budgets (tokens and
//! cost, from what its steps reported and its frozen prices) and its context limit (against
//! an estimate of the next request's size). A child of `machine`, over the machine's state.

use crate::replay::point::LastStep;
use broca_protocol::{Block, Message, Usage};
use broca_wal::runrec::{budget_stop, BudgetStop, FinishKind};

use super::RunMachine;
use crate::spend::least_input_cost_micros;

/// A stop condition the next request would break: the run's end, why, and the budget's
/// figures when a budget stopped it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Stop {
    pub kind: FinishKind,
    pub detail: String,
    pub budget: Option<BudgetStop>,
}

impl Stop {
    fn budget(
        kind: FinishKind,
        detail: String,
        measure: &str,
        limit: u64,
        spent: u64,
        cause: &str,
    ) -> Stop {
        Stop {
            kind,
            detail,
            budget: Some(BudgetStop {
                measure: measure.to_string(),
                limit,
                spent,
                cause: cause.to_string(),
            }),
        }
    }
}

impl RunMachine {
    /// The run's frozen prices.
    pub(super) fn prices(&self) -> Option<&broca_wal::runrec::CatalogPrices> {
        self.config.catalog.as_ref().and_then(|e| e.prices.as_ref())
    }

    /// The stop condition the next model request would break, if any: checked before each
    /// step and before a step's tools are dispatched. The session's input cap stops the run
    /// when the session's consumed input has reached it, or cannot be measured (a step did
    /// not report its input); it never estimates the next request. A run budget stops the
    /// run when it is spent, when the next request would surely overrun it (every request
    /// resends the conversation so far, so it carries at least the last step's input), or
    /// when a step it needs the measure of was not metered (`budget_unmeasured`, naming the
    /// step); a context limit stops it when the next request's estimated size reaches the
    /// limit.
    pub(super) fn limit_before_request(&self) -> Option<Stop> {
        self.budget_stop().or_else(|| {
            // A run that summarizes checks its context limit where the next step would
            // start, once a summary was considered (`next_step_or_stop`).
            if self.summarizes() {
                None
            } else {
                self.context_limit_stop()
            }
        })
    }

    /// The stop a budget or the session's input cap says the next request would break.
    fn budget_stop(&self) -> Option<Stop> {
        self.input_cap_stop()
            .or_else(|| self.unmeasured_budget_stop())
            .or_else(|| self.token_budget_stop())
            .or_else(|| self.cost_budget_stop())
    }

    /// Whether the run summarizes older turns as its context limit comes near (it has a
    /// compaction and a limit, and no summary of it failed).
    fn summarizes(&self) -> bool {
        self.config.compaction.is_some()
            && self.config.context_limit.is_some()
            && self.compaction_gave_up.is_none()
    }

    /// A run budget is not kept on a step that was not metered: the first such step stops
    /// the run (`budget_unmeasured`).
    fn unmeasured_budget_stop(&self) -> Option<Stop> {
        let stop = &self.config.stop;
        if stop.max_total_tokens.is_none() && stop.max_cost_micros.is_none() {
            return None;
        }
        let u = self.spend.first_unmeasured()?;
        let (measure, limit) = match stop.max_total_tokens {
            Some(l) => (budget_stop::MAX_TOTAL_TOKENS, l),
            None => (
                budget_stop::MAX_COST_MICROS,
                stop.max_cost_micros.unwrap_or(0),
            ),
        };
        Some(Stop::budget(
            FinishKind::BudgetUnmeasured,
            format!(
                "step {} (attempt {}) did not report its {} token count, and a budget is not \
                 kept on unmetered steps",
                u.step, u.attempt, u.missing
            ),
            measure,
            limit,
            0,
            budget_stop::USAGE_UNREPORTED,
        ))
    }

    /// The input the next request carries at least: it resends the conversation so far, so
    /// at least the last step's input.
    fn least_next_input(&self) -> Option<u64> {
        self.last_step.and_then(|l| l.usage.input)
    }

    /// The token budget is spent, or the next request would surely overrun it.
    fn token_budget_stop(&self) -> Option<Stop> {
        let budget = self.config.stop.max_total_tokens?;
        let used = self.spend.tokens().unwrap_or(0);
        let exhausted = |detail: String| {
            Some(Stop::budget(
                FinishKind::BudgetExhausted,
                detail,
                budget_stop::MAX_TOTAL_TOKENS,
                budget,
                used,
                budget_stop::LIMIT_REACHED,
            ))
        };
        if used >= budget {
            return exhausted(format!("{used} tokens used of a {budget}-token budget"));
        }
        let least = self.least_next_input()?;
        if used.saturating_add(least) <= budget {
            return None;
        }
        exhausted(format!(
            "{used} tokens used of a {budget}-token budget, and the next request would resend \
             at least the last step's {least} input tokens"
        ))
    }

    /// The cost budget cannot be priced (`budget_unmeasured`), is spent, or the next request
    /// would surely overrun it.
    fn cost_budget_stop(&self) -> Option<Stop> {
        let budget = self.config.stop.max_cost_micros?;
        let spec = || format!("{}/{}", self.config.provider, self.config.model);
        let unpriced = |detail: String| {
            Some(Stop::budget(
                FinishKind::BudgetUnmeasured,
                detail,
                budget_stop::MAX_COST_MICROS,
                budget,
                0,
                budget_stop::UNPRICED,
            ))
        };
        let prices = self.prices();
        let Some(prices) = prices.filter(|p| p.input.is_some() && p.output.is_some()) else {
            return unpriced(format!(
                "a cost budget needs input and output prices, and the catalog entry frozen for \
                 {} has none",
                spec()
            ));
        };
        let Some(cost) = self.spend.cost_micros() else {
            let (step, measure) = self
                .spend
                .unpriced()
                .map_or((0, "prices"), |u| (u.step, u.measure));
            return unpriced(format!(
                "step {step} reported {measure} tokens, and the catalog entry frozen for {} has \
                 no {measure} price",
                spec()
            ));
        };
        let currency = &prices.currency;
        let exhausted = |detail: String| {
            Some(Stop::budget(
                FinishKind::BudgetExhausted,
                detail,
                budget_stop::MAX_COST_MICROS,
                budget,
                cost,
                budget_stop::LIMIT_REACHED,
            ))
        };
        if cost >= budget {
            return exhausted(format!(
                "cost {cost} micro-{currency} of a {budget} micro-{currency} budget"
            ));
        }
        let least = self
            .least_next_input()
            .and_then(|i| least_input_cost_micros(Some(prices), i))?;
        if cost.saturating_add(least) <= budget {
            return None;
        }
        exhausted(format!(
            "cost {cost} micro-{currency} of a {budget} micro-{currency} budget, and the next \
             request would cost at least {least} more"
        ))
    }

    /// The next request's estimated size reaches the context limit.
    pub(super) fn context_limit_stop(&self) -> Option<Stop> {
        let limit = self.config.context_limit?;
        let (estimate, how) = self.next_request_estimate();
        if estimate < limit {
            return None;
        }
        let mut detail = format!(
            "the next request would carry about {estimate} tokens ({how}); the context limit \
             is {limit}"
        );
        if let Some(why) = &self.compaction_gave_up {
            detail.push_str("; ");
            detail.push_str(why);
        }
        Some(Stop {
            kind: FinishKind::ContextLimit,
            detail,
            budget: None,
        })
    }

    /// The session's input cap's stop, if it has one and it is due: its consumed input has
    /// reached the cap, or cannot be measured (a step did not report its input). Checked
    /// before each step and right after each step (the step that reaches the cap ends the
    /// run, its calls not dispatched); never an estimate of the next request.
    pub(super) fn input_cap_stop(&self) -> Option<Stop> {
        let cap = self.config.stop.input_cap?;
        let spent = self.input.spent;
        if self.input.unmeasured {
            return Some(Stop::budget(
                FinishKind::BudgetUnmeasured,
                format!(
                    "a step of this session did not report its input tokens, so its \
                     input cap ({}) cannot be kept; {spent} were measured before it",
                    cap.limit
                ),
                budget_stop::MAX_INPUT_TOKENS,
                cap.limit,
                spent,
                budget_stop::USAGE_UNREPORTED,
            ));
        }
        if spent >= cap.limit {
            return Some(Stop::budget(
                FinishKind::BudgetExhausted,
                format!(
                    "the session consumed {spent} input tokens of its {}-token input cap",
                    cap.limit
                ),
                budget_stop::MAX_INPUT_TOKENS,
                cap.limit,
                spent,
                budget_stop::LIMIT_REACHED,
            ));
        }
        None
    }

    /// An estimate of the next request's input tokens, and how it was made: the last step's
    /// reported input, plus its output (its message is sent back) and what was added since
    /// at about 4 bytes a token; without a reported input, the whole request at 4 bytes a
    /// token. An estimate, not a count: the provider's tokenizer decides.
    pub(super) fn next_request_estimate(&self) -> (u64, &'static str) {
        if let Some(LastStep {
            usage:
                Usage {
                    input: Some(input),
                    output,
                    ..
                },
            transcript_len,
        }) = self.last_step
        {
            let at = transcript_len.min(self.transcript.len());
            let added = approx_tokens(self.transcript[at..].iter().map(|m| message_bytes(m)));
            let output = output.unwrap_or_else(|| {
                approx_tokens(self.transcript[..at].last().map(|m| message_bytes(m)))
            });
            let estimate = input.saturating_add(output).saturating_add(added);
            return (
                estimate,
                "the last step's reported input and output, and about 4 bytes a token for what was added since",
            );
        }
        let fixed = self.config.system.as_ref().map_or(0, String::len)
            + serde_json::to_vec(&self.config.tools).map_or(0, |v| v.len());
        let all = approx_tokens(
            std::iter::once(fixed).chain(self.view().iter().map(|m| message_bytes(m))),
        );
        (
            all,
            "about 4 bytes a token, no step having reported its input yet",
        )
    }
}

/// About how many tokens `bytes` of text make (4 bytes a token, rounded up).
fn approx_tokens(bytes: impl IntoIterator<Item = usize>) -> u64 {
    (bytes.into_iter().sum::<usize>() as u64).div_ceil(4)
}

/// The bytes of a block's text, tool name, arguments or result (a medium's as it counts
/// against a context limit).
pub(super) fn block_bytes(b: &Block) -> usize {
    match b {
        Block::Text { text } => text.len(),
        Block::Thinking { text, signature } => {
            text.len() + signature.as_ref().map_or(0, String::len)
        }
        Block::ToolUse { id, name, input } => id.len() + name.len() + input.get().len(),
        Block::ToolResult {
            tool_use_id,
            content,
            ..
        } => tool_use_id.len() + content.len(),
        Block::Media(m) => broca_protocol::media::approx_bytes(m),
    }
}

/// The bytes of a message's text, tool names, arguments and results.
pub(super) fn message_bytes(m: &Message) -> usize {
    m.content.iter().map(block_bytes).sum()
}
