// When a mailbox consumer lets the next launch start (its form's TRIGGER_BEFORE_WAIT).
#pragma once

namespace pooler {

// After its PDL wait, or before it. Before pays where the next kernel is a GEMM that copies
// its whole w on chip in its prologue: the copies then start while this layer's GEMM still
// runs (docs/decisions/0016-consumer-trigger-before-wait.md). Both are safe: the next kernel
// waits for this one in its own PDL wait, and once every CTA of this grid has triggered, all of
// them are resident.
enum class ConsumerTrigger { after_wait, before_wait };

}  // namespace pooler
