// Builds against the installed package and checks one sketched round end to end.
#include <sketchsgd/sketchsgd.hpp>

#include <cstdio>
#include <vector>

int main() {
  const uint64_t dim = 10000;
  auto worker = sketchsgd::make_compressor("sketch:rows=5,cols=2000,k=10,momentum=0", dim);
  auto server = sketchsgd::make_compressor(worker->spec(), dim)->make_aggregator(1);
  std::vector<float> grad(dim, 0.0f);
  grad[1234] = 5.0f;
  grad[42] = -3.0f;
  server->add(worker->encode(grad, 0, 0));
  std::vector<float> step(dim);
  worker->apply(server->finish(), step);
  const bool ok = step[1234] == 5.0f && step[42] == -3.0f;
  std::printf("consumer: step[1234] = %g, step[42] = %g, cuda devices %d: %s\n", step[1234],
              step[42], sketchsgd::gpu::device_count(), ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
