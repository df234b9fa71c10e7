// Stand-in reference kernels of linear_quant_gcu and the MoE trio (filled in below).
#include "standin_ops.h"
