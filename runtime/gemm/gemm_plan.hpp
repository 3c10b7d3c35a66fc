// SPDX-License-Identifier: Apache-2.0
// A pooler GEMM problem and its shape, validated once (runtime/gemm/pooler_gemm.hpp
// has the kernel and the launcher; runtime/tuning/gemm_rule.hpp the rule that picks a shape). Light on includes, so
// that the list of a configuration's forms (runtime/pooler_forms.hpp) can hold plans.
#pragma once

#include <string>

#include "pooler/gemm_shape.hpp"
#include "runtime/jit/form.hpp"
#include "runtime/jit/kernel.hpp"

namespace pooler {

// The fused publish: the mailbox the GEMM's output goes to, [3 stages][tp
// slots][capacity rows][n] BF16 per rank (runtime/comm/mailbox.hpp), so n * tp is
// the pooled width P. Every rank's form must use the same tp and capacity.
struct GemmPublish {
  int tp = 0;        // 1, 2, 4 or 8
  int capacity = 0;  // rows per slot, >= rows
};

// The register path's middle steps of w on chip: steps [k_unroll, k_unroll + steps) of every row
// of a CTA's share go into shared memory by bulk copies issued before the PDL wait, `chunks` copies
// a row (each onto its own mbarrier, so the MMAs start as the first lands); the prologue's registers
// hold the first k_unroll steps and then stream the last ones (the tail) after the wait. The same
// MMA order as the register path, so the same bits. Only where x arrives well before the GEMM's
// wait does it pay (docs/design/gemm.md, "The middle of w on chip"). {} (no steps): all of w streams.
struct WShared {
  int steps = 0;   // K steps (32 K values each) a row keeps on chip; 0: none
  int chunks = 1;  // bulk copies a row, dividing steps
  bool operator==(const WShared&) const = default;
};

// One GEMM (rows, N, K, with or without the fused publish) and its shape,
// validated once at construction: the form, the launch shape and PoolerGemm
// built from a plan check nothing again.
class GemmPlan {
 public:
  // Throws InvalidArgument naming the first value that does not fit. With
  // `publish`, also the mailbox (tp, capacity >= rows, P = n * tp a valid
  // pooled width) and the fused form's shared memory. A `w_shared` with steps needs the register
  // path with one warp over K, and room (refused by name otherwise).
  GemmPlan(int rows, int n, int k, const PoolerGemmShape& shape, const GemmPublish* publish = nullptr,
           const WShared& w_shared = {});

  // The same GEMM fusing the publish: checks only what the publish adds (the
  // mailbox and the shared memory). InvalidArgument as the constructor.
  GemmPlan publishing(const GemmPublish& publish) const;

  int rows() const { return rows_; }
  int n() const { return n_; }
  int k() const { return k_; }
  const PoolerGemmShape& shape() const { return shape_; }
  const WShared& w_shared() const { return w_shared_; }
  // describe(shape()), and the middle of w on chip where the plan has one.
  std::string describe() const;
  // Null without the fused publish.
  const GemmPublish* publish() const { return publish_.tp != 0 ? &publish_ : nullptr; }
  // As pooler_gemm_shared_bytes.
  int shared_bytes() const { return shared_bytes_; }
  // As pooler_gemm_launch_shape.
  LaunchShape launch_shape() const;
  // Whether the prologue issues every load of w a CTA makes (w on chip, one
  // unrolled round of registers, or a ring that holds the warp's whole K
  // range): the next launch may then start at once.
  bool prologue_holds_all_of_w() const;
  // The template's TRIGGER_IN_PROLOGUE: the next launch starts before this GEMM's PDL wait
  // (only where the prologue holds all of w). Else it starts after the MMAs.
  bool triggers_in_prologue() const;
  // The GEMM lets the next launch start only after its own PDL wait (after its MMAs), which a
  // polling consumer after it needs (ConsumerTrigger).
  bool triggers_after_its_wait() const { return !triggers_in_prologue(); }
  // As pooler_gemm_form.
  Form form(bool trace = false) const;

 private:
  GemmPlan() = default;

  int rows_ = 0, n_ = 0, k_ = 0;
  PoolerGemmShape shape_;
  GemmPublish publish_;
  WShared w_shared_;
  int shared_bytes_ = 0;
};

// The shape's geometry before validation, for the rule that searches shapes
// (runtime/tuning/gemm_rule.hpp): one CTA's dynamic shared memory (as
// pooler_gemm_shared_bytes, `publish` for the fused publish's reduction), and whether the
// prologue issues every load of w a CTA makes (as the template's kAllOfWInPrologue: w on chip,
// one unrolled round of registers, or a ring that holds the warp's whole K range).
// `w_shared`: the middle of w on chip (WShared), with its mbarriers.
long long gemm_shared_bytes_unchecked(int rows, int k, const PoolerGemmShape& shape, bool publish = false,
                                      const WShared& w_shared = {});
bool gemm_prologue_holds_all_of_w(int rows, int k, const PoolerGemmShape& shape);

}  // namespace pooler
