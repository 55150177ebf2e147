// Gated delta net: the causal depthwise conv and the recurrent step.
#define CH (2 * HK * DK + HV * DV)

// One thread per conv channel, over the tokens in order. state: [KERN-1][CH], taps: [CH][KERN].
extern "C" __global__ void gdn_conv(const float* __restrict__ proj, int stride, int ntok,
                                    float* __restrict__ state, const float* __restrict__ taps,
                                    float* __restrict__ out) {
    PDL_ENTRY();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= CH) return;
    float s[KERN - 1], w[KERN];
#pragma unroll
    for (int j = 0; j < KERN - 1; j++) s[j] = state[j * CH + c];
#pragma unroll
    for (int j = 0; j < KERN; j++) w[j] = taps[c * KERN + j];
    for (int t = 0; t < ntok; t++) {
        const float x = proj[(size_t)t * stride + c];
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < KERN - 1; j++) acc += w[j] * s[j];
        acc += w[KERN - 1] * x;
        out[(size_t)t * CH + c] = siluf_(acc);
#pragma unroll
        for (int j = 0; j < KERN - 2; j++) s[j] = s[j + 1];
        s[KERN - 2] = x;
    }
#pragma unroll
    for (int j = 0; j < KERN - 1; j++) state[j * CH + c] = s[j];
}

// The recurrent step. grid (HV, DV/32), block (32, 4): thread (x, y) owns column j = 32*by + x
// of the value head's state for key rows 32y..32y+31, kept in registers across the tokens.
// S: [HV][DK][DV]; o: [ntok][HV*DV].
extern "C" __global__ void __launch_bounds__(128)
gdn_step(const float* __restrict__ conv, const float* __restrict__ proj, int stride, int aoff,
         int boff, int ntok, const float* __restrict__ a_neg, const float* __restrict__ dt_bias,
         float* __restrict__ S, float* __restrict__ o) {
    PDL_ENTRY();
    __shared__ float qs[DK], ks[DK], red[4][32], red2[4][32], red3[8], gb[2];
    const int h = blockIdx.x, kh = h % HK;
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 32 + tx;
    const int j = blockIdx.y * 32 + tx;
    float* Sh = S + (size_t)h * DK * DV;
    float s[32];
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = Sh[(size_t)(ty * 32 + i) * DV + j];
    const float scale = 1.0f / sqrtf((float)DK);
    for (int t = 0; t < ntok; t++) {
        const float* x = conv + (size_t)t * CH;
        const float qv = x[kh * DK + tid];
        const float kv = x[HK * DK + kh * DK + tid];
        float sq = warp_sum(qv * qv), sk = warp_sum(kv * kv);
        if (tx == 0) { red3[ty] = sq; red3[4 + ty] = sk; }
        if (tid == 0) {
            const float a = proj[(size_t)t * stride + aoff + h];
            const float b = proj[(size_t)t * stride + boff + h];
            gb[0] = expf(a_neg[h] * softplusf_(a + dt_bias[h]));
            gb[1] = sigmoidf_(b);
        }
        __syncthreads();
        sq = red3[0] + red3[1] + red3[2] + red3[3];
        sk = red3[4] + red3[5] + red3[6] + red3[7];
        qs[tid] = qv * (1.0f / sqrtf(sq + 1e-6f));
        ks[tid] = kv * (1.0f / sqrtf(sk + 1e-6f));
        __syncthreads();
        const float g = gb[0], beta = gb[1];
        float km = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i++) {
            s[i] *= g;
            km += s[i] * ks[ty * 32 + i];
        }
        red[ty][tx] = km;
        __syncthreads();
        const float kvm = red[0][tx] + red[1][tx] + red[2][tx] + red[3][tx];
        const float v = x[2 * HK * DK + h * DV + j];
        const float delta = (v - kvm) * beta;
        float oo = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i++) {
            s[i] += ks[ty * 32 + i] * delta;
            oo += s[i] * (qs[ty * 32 + i] * scale);
        }
        red2[ty][tx] = oo;
        __syncthreads();
        if (ty == 0) o[(size_t)t * HV * DV + h * DV + j] = red2[0][tx] + red2[1][tx] + red2[2][tx] + red2[3][tx];
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 32; i++) Sh[(size_t)(ty * 32 + i) * DV + j] = s[i];
}
