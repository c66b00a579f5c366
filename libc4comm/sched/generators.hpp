// Internal to c4_sched: the generator of each (algorithm, collective) pair. Each emits the steps of
// b.rank() for nranks >= 2 and count >= 1 (generate() handles the trivial cases and validation).
#pragma once

#include "sched/builder.hpp"

namespace c4::sched::detail {

// ring.cc
void ringAllReduce(Builder& b);
void ringAllGather(Builder& b);
void ringReduceScatter(Builder& b);
void ringBroadcast(Builder& b);
void ringReduce(Builder& b);

// tree.cc
void treeAllReduce(Builder& b);
void treeBroadcast(Builder& b);
void treeReduce(Builder& b);

// rhd.cc
void rhdAllReduce(Builder& b);
void rhdAllGather(Builder& b);
void rhdReduceScatter(Builder& b);

// direct.cc
void directAllReduce(Builder& b);
void directAllGather(Builder& b);
void directReduceScatter(Builder& b);
void directBroadcast(Builder& b);
void directReduce(Builder& b);
void directAlltoAll(Builder& b);
void directGather(Builder& b);
void directScatter(Builder& b);

// hier.cc (reads CollArgs::hostOf)
void hierAllReduce(Builder& b);

}  // namespace c4::sched::detail
