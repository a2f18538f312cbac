// In-process parameter-server round: W worker codecs + one aggregator, no sockets.
#pragma once

#include <memory>
#include <vector>

#include <sketchsgd/compress/compressor.hpp>
#include <sketchsgd/compress/registry.hpp>

namespace sketchsgd::test {

struct Job {
  std::vector<std::unique_ptr<Compressor>> workers;
  std::unique_ptr<Aggregator> server;

  Job(const std::string& spec, uint64_t dim, uint32_t world) {
    for (uint32_t w = 0; w < world; ++w) workers.push_back(make_compressor(spec, dim));
    auto codec = make_compressor(spec, dim);
    server = codec->make_aggregator(world);
    server_codec = std::move(codec);
  }

  /// One round; returns every worker's step (they must agree).
  std::vector<std::vector<float>> round(const std::vector<std::vector<float>>& grads, uint64_t r) {
    for (uint32_t w = 0; w < workers.size(); ++w) server->add(workers[w]->encode(grads[w], r, w));
    Message out = server->finish();
    if (server->expecting() == MessageKind::Answer) {
      for (uint32_t w = 0; w < workers.size(); ++w) server->add(workers[w]->answer(out, w));
      out = server->finish();
    }
    last_update = out;
    std::vector<std::vector<float>> steps(workers.size(), std::vector<float>(grads[0].size()));
    for (uint32_t w = 0; w < workers.size(); ++w) workers[w]->apply(out, steps[w]);
    return steps;
  }

  std::unique_ptr<Compressor> server_codec;
  Message last_update;
};

}  // namespace sketchsgd::test
