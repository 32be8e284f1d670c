#pragma once
// The scheduler's counters as `specula serve` shows them: Prometheus text at /metrics, and its
// JSON twin at /metrics.json for the live page.
#include <string>

#include <nlohmann/json.hpp>

#include "server/scheduler.h"

namespace specula {

std::string prometheus(const SchedulerMetrics & m);
nlohmann::json metrics_json(const SchedulerMetrics & m);

}  // namespace specula
