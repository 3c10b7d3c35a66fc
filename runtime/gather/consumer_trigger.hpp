// SPDX-License-Identifier: Apache-2.0
// When a mailbox consumer lets the next launch start, and when it waits for the previous one
// (its form's TRIGGER_BEFORE_WAIT and POLLING).
#pragma once

namespace pooler {

// after_wait: triggers after its PDL wait. before_wait: triggers before it; pays where the next
// kernel is a GEMM that copies its whole w on chip in its prologue: the copies then start while
// this layer's GEMM still runs (docs/decisions/0016-consumer-trigger-before-wait.md). Both are
// safe: the next kernel waits for this one in its own PDL wait, and once every CTA of this grid has
// triggered, all of them are resident.
// polling: takes its call's hand-over (by its publisher's ticket) and polls the mailbox before its
// PDL wait, triggers once its row is read, and waits at its end (decision 0022); valid after any
// publisher that took a ticket: every one but a GEMM that triggers in its prologue (decision 0026).
// polling_early: the same, but triggers once it has seen its publisher's ticket, so that the next
// GEMM's prologue overlaps the poll; pays where that prologue is short (decision 0023).
enum class ConsumerTrigger { after_wait, before_wait, polling, polling_early };
inline constexpr int kConsumerTriggers = 4;
inline constexpr ConsumerTrigger kAllConsumerTriggers[kConsumerTriggers] = {
    ConsumerTrigger::after_wait, ConsumerTrigger::before_wait, ConsumerTrigger::polling,
    ConsumerTrigger::polling_early};

// Whether the consumer reads the state and polls before its PDL wait (POLLING = 1).
constexpr bool polls(ConsumerTrigger trigger) {
  return trigger == ConsumerTrigger::polling || trigger == ConsumerTrigger::polling_early;
}

}  // namespace pooler
