// ALiBi's fixed per-head slopes (Press et al., 2022), shared by every ALiBi variant.
#pragma once

#include <vector>

namespace extrap {

// n heads, n a power of two: 2^(-8/n), 2^(-16/n), ..., 2^(-8). Otherwise the slopes of the
// largest power of two p < n, followed by slopes 0, 2, 4, ... of the 2p-head sequence until
// there are n. Computed in double precision.
std::vector<double> alibi_slopes(int num_heads);

}  // namespace extrap
