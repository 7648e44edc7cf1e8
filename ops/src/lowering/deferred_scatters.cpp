#include "deferred_scatters.hpp"

#include <cassert>
#include <exception>
#include <utility>

namespace numesh::ops::detail {

namespace {
thread_local DeferredScatters* innermost = nullptr;
}  // namespace

DeferredScatters::DeferredScatters() : outer_(innermost) { innermost = this; }

DeferredScatters::~DeferredScatters() {
  assert(hosts_.empty() || std::uncaught_exceptions() > 0);  // a layout forgot its flush()
  innermost = outer_;
}

DeferredScatters* DeferredScatters::active() noexcept { return innermost; }

bool DeferredScatters::defers(const runtime::HostTensor& host) noexcept {
  return host.data.size() * sizeof(float) <= kMaxBytes;
}

void DeferredScatters::add(runtime::HostTensor host,
                           std::shared_ptr<runtime::ShardedTensor> tensor) {
  hosts_.push_back(std::move(host));
  tensors_.push_back(std::move(tensor));
}

void DeferredScatters::flush() {
  // Taken out first: a flush that throws leaves nothing to write twice.
  const std::vector<runtime::HostTensor> kept = std::exchange(hosts_, {});
  const std::vector<std::shared_ptr<runtime::ShardedTensor>> owners = std::exchange(tensors_, {});
  std::vector<const runtime::HostTensor*> hosts;
  std::vector<runtime::ShardedTensor*> tensors;
  for (std::size_t i = 0; i < kept.size(); ++i) {
    hosts.push_back(&kept[i]);
    tensors.push_back(owners[i].get());
  }
  runtime::scatter(hosts, tensors);
}

}  // namespace numesh::ops::detail
