// A stage sums its own gradients' squares before the running sum from
// upstream arrives and folds them in afterwards: the total must be the bits
// of summing them into the running sum directly, or the reported gradient
// norm and the clipping coefficient would depend on the order of events.
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/core/rng.h"
#include "services/nn/model.h"
#include "services/nn/optimizer.h"

namespace gpipe {
namespace {

TEST(GradSquaresTest, TwoHalvesAreBitwiseTheOnePass) {
  // Parameters of very different scales, so the order of additions shows.
  std::vector<std::unique_ptr<Parameter>> owned;
  std::vector<NamedParameter> params;
  Rng rng(17);
  for (int i = 0; i < 6; ++i) {
    const int64_t n = 1 + 97 * i;
    std::vector<float> g(n);
    for (float& x : g)
      x = static_cast<float>(rng.Normal() * std::pow(10.0, 3 - 2 * i));
    auto p = std::make_unique<Parameter>();
    p->value = Tensor::Zeros(Shape({n}));
    p->grad = Tensor::FromVector(Shape({n}), g);
    params.push_back({"p" + std::to_string(i), p.get()});
    owned.push_back(std::move(p));
  }
  const std::vector<double> by_parameter = GradSquaresByParameter(params);
  ASSERT_EQ(by_parameter.size(), params.size());
  for (double running : {0.0, 1e-7, 3.25, 1e9}) {
    const double one_pass = AccumulateGradSquares(params, running);
    const double folded = FoldGradSquares(by_parameter, running);
    EXPECT_EQ(std::memcmp(&one_pass, &folded, sizeof(double)), 0)
        << "running " << running << ": " << one_pass << " vs " << folded;
  }
  EXPECT_EQ(FoldGradSquares({}, 2.5), 2.5);
}

}  // namespace
}  // namespace gpipe
