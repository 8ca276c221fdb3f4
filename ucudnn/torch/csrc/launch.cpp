// ucudnn.torch's compiled launch path: a converted layer's forward, backward-data and backward-filter without
// Python between torch's dispatcher and cuDNN.
//
// Why: a training step launches every convolution three times, and on small kernels (ResNet-50 b128 under AMP:
// many take 20-60 us of GPU time) the host's work per launch decides the step time.  The Python path (an autograd
// Function, the operands' checks, the prepared call's lookup, the frontend's pybind execute) cost a converted
// ResNet-50 AMP step 107 py-spy samples against PyTorch's 74 (benchmarks/results/torch_host_spy-*), 0.48-0.82x
// PyTorch's images/s.  Here one op, ``ucudnn_c::conv2d``, does what ``nn.Conv2d``'s C++ path does: autocast's
// casts, an autograd node (C++), outputs and workspace from torch's caching allocator, torch's current stream.
//
// What it runs: plans (one step or micro-batched) whose steps come from the legacy source (cudnnConvolution*
// with the source's own descriptors, beta 1 where a step accumulates), the graph source (the engine
// configuration a step names, rebuilt here through cuDNN's backend API from its global index and knobs: the same
// execution plan the frontend builds) and ucudnn's own kernels that describe their launches (the depthwise
// kernels: CUDA functions CuPy loaded, with grid, block, shared memory and arguments, launched here through the
// CUDA driver's cuLaunchKernel on the same stream); a graph step that accumulates runs its engine (built with beta
// 0) into scratch and adds that into the output with cudnnTransformTensor.  Everything else (the other own
// kernels, misaligned graph operands, a launch cuDNN refuses, a workspace torch cannot allocate) goes back to
// Python through ``ucudnn_c::py_launch``, whose implementation is the Python path: results never depend on which
// path ran.
//
// cuDNN is reached through the library ucudnn's binding loaded (its path from Python; dlopen returns the same
// instance, so the legacy descriptors Python made are valid here), and only its C ABI: no cuDNN or CUDA headers,
// so this file builds against any torch wheel, CPU builds included (a CPU test compiles it).
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using at::Tensor;
using Status = int;
using Handle = void*;
using Desc = void*;

// ---- cuDNN's C ABI (values from cudnn_graph.h / cudnn_backend.h, stable across cuDNN 9) ----------------------
enum : int {
  // cudnnBackendDescriptorType_t
  D_CONVOLUTION = 1, D_ENGINE = 2, D_ENGINECFG = 3, D_EXECUTION_PLAN = 5, D_KNOB_CHOICE = 7,
  D_OP_CONV_FORWARD = 10, D_OP_CONV_BACKWARD_FILTER = 11, D_OP_CONV_BACKWARD_DATA = 12, D_OPERATIONGRAPH = 15,
  D_VARIANT_PACK = 16, D_TENSOR = 17,
  // cudnnBackendAttributeType_t
  T_HANDLE = 0, T_DATA_TYPE = 1, T_INT64 = 3, T_FLOAT = 4, T_VOID_PTR = 6, T_CONVOLUTION_MODE = 7, T_KNOB_TYPE = 9,
  T_BACKEND_DESCRIPTOR = 15,
  // cudnnBackendAttributeName_t
  A_CONV_COMP_TYPE = 100, A_CONV_MODE = 101, A_CONV_DILATIONS = 102, A_CONV_FILTER_STRIDES = 103,
  A_CONV_POST_PADDINGS = 104, A_CONV_PRE_PADDINGS = 105, A_CONV_SPATIAL_DIMS = 106,
  A_ENGINECFG_ENGINE = 300, A_ENGINECFG_KNOB_CHOICES = 302,
  A_PLAN_HANDLE = 400, A_PLAN_ENGINE_CONFIG = 401, A_PLAN_WORKSPACE_SIZE = 402,
  A_KNOB_CHOICE_TYPE = 600, A_KNOB_CHOICE_VALUE = 601,
  A_FWD_ALPHA = 700, A_FWD_BETA = 701, A_FWD_CONV = 702, A_FWD_W = 703, A_FWD_X = 704, A_FWD_Y = 705,
  A_BWD_DATA_ALPHA = 706, A_BWD_DATA_BETA = 707, A_BWD_DATA_CONV = 708, A_BWD_DATA_W = 709, A_BWD_DATA_DX = 710,
  A_BWD_DATA_DY = 711,
  A_BWD_FILTER_ALPHA = 712, A_BWD_FILTER_BETA = 713, A_BWD_FILTER_CONV = 714, A_BWD_FILTER_DW = 715,
  A_BWD_FILTER_X = 716, A_BWD_FILTER_DY = 717,
  A_OPGRAPH_HANDLE = 800, A_OPGRAPH_OPS = 801,
  A_TENSOR_BYTE_ALIGNMENT = 900, A_TENSOR_DATA_TYPE = 901, A_TENSOR_DIMENSIONS = 902, A_TENSOR_STRIDES = 903,
  A_TENSOR_UNIQUE_ID = 906,
  A_VARIANT_PACK_UNIQUE_IDS = 1000, A_VARIANT_PACK_DATA_POINTERS = 1001, A_VARIANT_PACK_WORKSPACE = 1003,
  A_ENGINE_OPERATION_GRAPH = 1300, A_ENGINE_GLOBAL_INDEX = 1301,
  // cudnnDataType_t, cudnnConvolutionMode_t
  DATA_FLOAT = 0, CROSS_CORRELATION = 1,
};

//: the op numbers Python and this file share: forward (x, w -> y), backward data (w, dy -> dx), backward filter
//: (x, dy -> dw): operands in cuDNN's order, as ucudnn's executors take them
enum Op : int64_t { FORWARD = 0, BACKWARD_DATA = 1, BACKWARD_FILTER = 2 };

using LegacyFn = Status (*)(Handle, const void*, Desc, const void*, Desc, const void*, Desc, int, void*, size_t,
                            const void*, Desc, void*);

// ---- the CUDA driver's launch (own kernels), resolved from libcuda.so.1 when the first such launch registers --
using LaunchKernelFn = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                               void**, void**);
LaunchKernelFn launch_kernel = nullptr;

struct Cudnn {
  Status (*create)(Handle*) = nullptr;
  Status (*set_stream)(Handle, void*) = nullptr;
  LegacyFn legacy[3] = {nullptr, nullptr, nullptr};
  Status (*be_create)(int, Desc*) = nullptr;
  Status (*be_destroy)(Desc) = nullptr;
  Status (*be_set)(Desc, int, int, int64_t, const void*) = nullptr;
  Status (*be_get)(Desc, int, int, int64_t, int64_t*, void*) = nullptr;
  Status (*be_finalize)(Desc) = nullptr;
  Status (*be_execute)(Handle, Desc, Desc) = nullptr;
  Status (*transform)(Handle, const void*, Desc, const void*, const void*, Desc, void*) = nullptr;
  const char* (*error_string)(Status) = nullptr;
  bool ready = false;
};

Cudnn cudnn;
std::mutex registry_mutex;

template <class F>
void resolve(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  TORCH_CHECK(fn != nullptr, "ucudnn: ", name, " not found in libcudnn");
}

std::string status_text(Status s) {
  const char* t = cudnn.error_string ? cudnn.error_string(s) : nullptr;
  return t ? std::string(t) : ("cudnn status " + std::to_string(s));
}

// ---- handles: one per (thread, device), bound to the stream of the launch ------------------------------------
struct HandleSlot {
  Handle handle = nullptr;
  void* stream = reinterpret_cast<void*>(-1);
};

Handle handle_for(c10::DeviceIndex device, void* stream) {
  thread_local std::unordered_map<int, HandleSlot> slots;
  HandleSlot& slot = slots[device];
  if (slot.handle == nullptr) {
    c10::DeviceGuard guard(c10::Device(c10::kCUDA, device));
    Status s = cudnn.create(&slot.handle);
    TORCH_CHECK(s == 0, "ucudnn: cudnnCreate: ", status_text(s));
  }
  if (slot.stream != stream) {
    Status s = cudnn.set_stream(slot.handle, stream);
    TORCH_CHECK(s == 0, "ucudnn: cudnnSetStream: ", status_text(s));
    slot.stream = stream;
  }
  return slot.handle;
}

void* current_stream(c10::DeviceIndex device) {
  static c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  return impl.getStream(c10::Device(c10::kCUDA, device)).native_handle();
}

// ---- launches ---------------------------------------------------------------------------------------------
struct Launch {
  int64_t op = 0;
  bool backend = false;
  int64_t workspace = 0;   // bytes this configuration needs (its program allocates the most of its steps')
  // legacy: the source's descriptors (Python keeps them alive) and algorithm
  Desc a = nullptr, b = nullptr, out = nullptr, conv = nullptr;
  int algo = 0;
  // backend: the execution plan and its tensors' uids
  Desc plan = nullptr;
  std::array<int64_t, 3> uids{1, 2, 3};
  int64_t alignment = 16;
  // backend, a step that accumulates (the plan is built with beta 0): the engine writes into scratch ``scratch_at``
  // bytes into the step's workspace (after the engine's own), then cudnnTransformTensor adds its ``out_bytes`` into
  // the output (``blend``: the output's legacy descriptor, the graph source's, kept alive by Python), as the graph
  // source's Python launcher does; nullptr: this launch cannot accumulate
  Desc blend = nullptr;
  int64_t scratch_at = 0, out_bytes = 0;
  // own kernels: the calls in order, each a CUDA function (the vector one where the operands its mask names are
  // 16-byte aligned), its launch geometry and its arguments: operands and alpha / beta filled at each launch
  struct Call {
    void* scalar = nullptr;
    void* vector = nullptr;
    int aligned = 0;   // bits: 1 a, 2 b, 4 out
    unsigned dims[7] = {1, 1, 1, 1, 1, 1, 0};   // grid, block, dynamic shared memory bytes
    std::vector<int8_t> kinds;   // ArgKind
    std::vector<int64_t> ints;
    std::vector<float> floats;
  };
  std::vector<Call> calls;
};
enum ArgKind : int8_t { ARG_A = 0, ARG_B = 1, ARG_OUT = 2, ARG_ALPHA = 3, ARG_BETA = 4, ARG_I32 = 5, ARG_I64 = 6,
                        ARG_F32 = 7, ARG_WS = 8 };

// launches and layers live for the process (a few per distinct convolution), so the integers Python holds stay
// valid for every autograd node that refers to them
std::vector<std::unique_ptr<Launch>> launches;

// A plan's steps as the executor runs them: each a launch on the operands shifted to its micro-batch (and channel
// slice), accumulating into what earlier steps wrote (beta = 1: legacy launches only) or not, with its workspace
// from the call's buffer or (``from_out`` >= 0, issue 18's unwritten memory) from memory not written yet: forward
// and backward data, the output's tail from that many bytes into the output (the later samples' output, written
// by later steps), rounded up to 256 bytes, to its end; backward filter, the buffer its caller lends (the layer's
// dx before backward data writes it: Conv::backward), from that many bytes in.
struct Step {
  const Launch* launch = nullptr;
  std::array<int64_t, 3> shifts{0, 0, 0};
  bool accumulate = false;
  int64_t from_out = -1;
  // bytes of workspace this step needs: its launch's, or (a backend step that accumulates) its scratch's end
  int64_t need() const {
    return accumulate && launch->backend ? std::max(launch->workspace, launch->scratch_at + launch->out_bytes)
                                         : launch->workspace;
  }
};
constexpr uintptr_t UNWRITTEN_ALIGN = 256;   // ucudnn.planning.wr.UNWRITTEN_ALIGN

struct Program {
  std::vector<Step> steps;
  int64_t workspace = 0;   // bytes taken from torch's allocator once per call, for every step
  bool aligned = false;    // some step is a backend plan, whose tensors are declared 16-byte aligned
};
std::vector<std::unique_ptr<Program>> programs;

struct Layer {
  Program* program[3] = {nullptr, nullptr, nullptr};  // nullptr: that op runs through Python (py_launch)
  // the backward filter's plan that takes workspace from the layer's dx before backward data writes it
  // (``UCUDNN_UNWRITTEN``), run first when both gradients are wanted; nullptr: none (program[2] then)
  Program* dw_in_dx = nullptr;
  std::vector<int64_t> y_shape;
  at::MemoryFormat format = at::MemoryFormat::Contiguous;
  int64_t py_layer = 0;                               // Python's key for py_launch
};
std::vector<std::unique_ptr<Layer>> layers;

Layer& layer_at(int64_t id) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  TORCH_CHECK(id >= 0 && id < static_cast<int64_t>(layers.size()), "ucudnn: unknown layer ", id);
  return *layers[id];
}

// ``l``'s own kernels on raw pointers, on ``stream``; the driver's status (0: launched).
Status launch_kernels(const Launch& l, void* stream, void* pa, void* pb, void* po, void* ws, bool accumulate) {
  union Value {
    void* p;
    float f;
    int32_t i;
    int64_t l;
  };
  std::array<Value, 32> values{};
  std::array<void*, 32> params{};
  void* const ptrs[3] = {pa, pb, po};
  for (const Launch::Call& c : l.calls) {
    bool vector = c.vector != nullptr;
    for (int r = 0; r < 3 && vector; ++r) {
      if ((c.aligned >> r & 1) && reinterpret_cast<uintptr_t>(ptrs[r]) % 16) vector = false;
    }
    for (size_t i = 0; i < c.kinds.size(); ++i) {
      Value& v = values[i];
      switch (c.kinds[i]) {
        case ARG_A: case ARG_B: case ARG_OUT: v.p = ptrs[c.kinds[i]]; break;
        case ARG_ALPHA: v.f = 1.0f; break;
        case ARG_BETA: v.f = accumulate ? 1.0f : 0.0f; break;
        case ARG_I32: v.i = static_cast<int32_t>(c.ints[i]); break;
        case ARG_I64: v.l = c.ints[i]; break;
        case ARG_WS: v.p = ws; break;
        default: v.f = c.floats[i]; break;
      }
      params[i] = &v;
    }
    const Status s = launch_kernel(vector ? c.vector : c.scalar, c.dims[0], c.dims[1], c.dims[2], c.dims[3],
                                   c.dims[4], c.dims[5], c.dims[6], stream, params.data(), nullptr);
    if (s != 0) return s;
  }
  return 0;
}

// One launch of ``l`` on raw pointers; cuDNN's status (own kernels: the driver's).
Status launch_one(const Launch& l, Handle h, void* stream, void* pa, void* pb, void* po, void* ws_ptr,
                  int64_t ws_bytes, bool accumulate) {
  static const float one = 1.0f, zero = 0.0f;
  if (!l.calls.empty()) return launch_kernels(l, stream, pa, pb, po, ws_ptr, accumulate);
  if (!l.backend) {
    return cudnn.legacy[l.op](h, &one, l.a, pa, l.b, pb, l.conv, l.algo, ws_ptr, static_cast<size_t>(ws_bytes),
                              accumulate ? &one : &zero, l.out, po);
  }
  Desc pack = nullptr;
  Status s = cudnn.be_create(D_VARIANT_PACK, &pack);
  if (s != 0) return s;
  void* ptrs[3] = {pa, pb, po};
  s = cudnn.be_set(pack, A_VARIANT_PACK_UNIQUE_IDS, T_INT64, 3, l.uids.data());
  if (accumulate) {
    // checked at registration (add_program) and before the run (run_native): the scratch fits the workspace
    ptrs[2] = static_cast<char*>(ws_ptr) + l.scratch_at;
  }
  if (s == 0) s = cudnn.be_set(pack, A_VARIANT_PACK_DATA_POINTERS, T_VOID_PTR, 3, ptrs);
  if (s == 0) s = cudnn.be_set(pack, A_VARIANT_PACK_WORKSPACE, T_VOID_PTR, 1, &ws_ptr);
  if (s == 0) s = cudnn.be_finalize(pack);
  if (s == 0) s = cudnn.be_execute(h, l.plan, pack);
  cudnn.be_destroy(pack);
  if (s == 0 && accumulate) s = cudnn.transform(h, &one, l.blend, ptrs[2], &one, l.blend, po);
  return s;
}

// Runs program ``P`` on the tensors' memory; false when it cannot here (operands a backend step would see
// misaligned: checked before anything runs) or cuDNN refuses a step.  The caller then runs the whole op through
// Python, which rewrites every element a partial run may have written (each op's first write to an element has
// beta = 0), so a refusal mid-way loses nothing.
bool run_native(const Program& P, const Tensor& a, const Tensor& b, const Tensor& out,
                const Tensor* lent = nullptr) {
  const c10::DeviceIndex device = out.device().index();
  char* pa = static_cast<char*>(a.data_ptr());
  char* pb = static_cast<char*>(b.data_ptr());
  char* po = static_cast<char*>(out.data_ptr());
  if (P.aligned) {
    for (const Step& s : P.steps) {
      if (s.launch->backend &&
          (reinterpret_cast<uintptr_t>(pa + s.shifts[0]) | reinterpret_cast<uintptr_t>(pb + s.shifts[1]) |
           reinterpret_cast<uintptr_t>(po + s.shifts[2])) % s.launch->alignment) {
        return false;   // Python stages misaligned micro-batches through aligned buffers
      }
    }
  }
  Tensor ws;
  void* ws_ptr = nullptr;
  if (P.workspace > 0) {
    ws = at::empty({P.workspace}, out.options().dtype(at::kByte).memory_format(at::MemoryFormat::Contiguous));
    ws_ptr = ws.data_ptr();
  }
  // every step's workspace first: a tail shorter than its step needs sends the whole op to Python before anything
  // runs (the Python path says why)
  // memory not written yet: the output's own tail, or (backward filter) the buffer the caller lends
  const bool own = P.steps.front().launch->op != BACKWARD_FILTER;
  const uintptr_t base = own ? reinterpret_cast<uintptr_t>(po)
                             : (lent != nullptr ? reinterpret_cast<uintptr_t>(lent->data_ptr()) : 0);
  const uintptr_t end = base + static_cast<uintptr_t>(own ? out.nbytes() : (lent != nullptr ? lent->nbytes() : 0));
  std::vector<std::pair<void*, int64_t>> spaces;
  spaces.reserve(P.steps.size());
  for (const Step& s : P.steps) {
    if (s.from_out < 0) {
      spaces.emplace_back(ws_ptr, P.workspace);
      continue;
    }
    if (base == 0) return false;   // a backward filter that borrows, called with nothing to lend
    const uintptr_t start = (base + static_cast<uintptr_t>(s.from_out) + UNWRITTEN_ALIGN - 1) / UNWRITTEN_ALIGN *
                            UNWRITTEN_ALIGN;
    const int64_t size = start < end ? static_cast<int64_t>(end - start) : 0;
    if (size < s.need()) return false;
    spaces.emplace_back(reinterpret_cast<void*>(start), size);
  }
  void* const stream = current_stream(device);
  Handle h = handle_for(device, stream);
  for (size_t i = 0; i < P.steps.size(); ++i) {
    const Step& s = P.steps[i];
    if (launch_one(*s.launch, h, stream, pa + s.shifts[0], pb + s.shifts[1], po + s.shifts[2], spaces[i].first,
                   spaces[i].second, s.accumulate) != 0) {
      return false;
    }
  }
  return true;
}

// Python's implementation of an op this file does not run (or cuDNN refused): the whole Python path for it.
void py_launch(int64_t op, const Tensor& a, const Tensor& b, const Tensor& out, int64_t py_layer) {
  static auto handle = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("ucudnn_c::py_launch", "")
                           .typed<void(int64_t, const Tensor&, const Tensor&, const Tensor&, int64_t)>();
  handle.call(op, a, b, out, py_layer);
}

// launches run here and launches sent to Python, per op (``stats``: what a benchmark reports beside its times)
std::array<std::atomic<int64_t>, 6> counts{};

void run(const Layer& L, int64_t op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const Program* p = L.program[op];
  if (p != nullptr) {
    try {
      if (run_native(*p, a, b, out)) {
        counts[op].fetch_add(1, std::memory_order_relaxed);
        return;
      }
    } catch (const c10::OutOfMemoryError&) {
      // no workspace now: Python's path decides (a smaller plan or torch's own convolution)
    }
  }
  counts[3 + op].fetch_add(1, std::memory_order_relaxed);
  py_launch(op, a, b, out, L.py_layer);
}

std::vector<int64_t> stats() {
  std::vector<int64_t> out;
  for (auto& c : counts) out.push_back(c.load());
  return out;
}

// ---- the autograd node ------------------------------------------------------------------------------------
struct Conv : public torch::autograd::Function<Conv> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& x_in, const Tensor& w_in,
                        int64_t layer) {
    const Layer& L = layer_at(layer);
    Tensor x = x_in.contiguous(L.format);
    Tensor w = w_in.contiguous(L.format);
    Tensor y = at::empty(L.y_shape, x.options().memory_format(L.format));
    run(L, FORWARD, x, w, y);
    ctx->save_for_backward({x, w});
    ctx->saved_data["layer"] = layer;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const Layer& L = layer_at(ctx->saved_data["layer"].toInt());
    auto saved = ctx->get_saved_variables();
    const Tensor& x = saved[0];
    const Tensor& w = saved[1];
    Tensor dy = grads[0].contiguous(L.format);
    Tensor dx, dw;
    if (L.dw_in_dx != nullptr && ctx->needs_input_grad(0) && ctx->needs_input_grad(1)) {
      // dw first, its plan taking workspace from dx's buffer, which backward data then writes (as the Python
      // path's EagerConv2d.backward does); where that cannot run here, the plain backward-filter plan does
      dx = at::empty(x.sizes(), dy.options().memory_format(L.format));
      dw = at::empty(w.sizes(), dy.options().memory_format(L.format));
      bool done = false;
      try {
        done = run_native(*L.dw_in_dx, x, dy, dw, &dx);
      } catch (const c10::OutOfMemoryError&) {
      }
      if (done) {
        counts[BACKWARD_FILTER].fetch_add(1, std::memory_order_relaxed);
      } else {
        run(L, BACKWARD_FILTER, x, dy, dw);
      }
      run(L, BACKWARD_DATA, w, dy, dx);
      return {dx, dw, Tensor()};
    }
    if (ctx->needs_input_grad(0)) {
      dx = at::empty(x.sizes(), dy.options().memory_format(L.format));
      run(L, BACKWARD_DATA, w, dy, dx);
    }
    if (ctx->needs_input_grad(1)) {
      dw = at::empty(w.sizes(), dy.options().memory_format(L.format));
      run(L, BACKWARD_FILTER, x, dy, dw);
    }
    return {dx, dw, Tensor()};
  }
};

// y = conv2d(x, w) + bias, autocast's casts first (``cast``: the autocast dtype Python saw, or none).  The bias is
// added into y in place, as torch's own convolution adds it: the convolution's node saved x and w, not y, so autograd
// allows it, and no second output-sized tensor lives beside y.
Tensor conv2d(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias, int64_t layer,
              std::optional<at::ScalarType> cast) {
  Tensor xc = x, wc = w;
  std::optional<Tensor> bc = bias;
  if (cast.has_value()) {
    xc = at::autocast::cached_cast(*cast, x, c10::DeviceType::CUDA);
    wc = at::autocast::cached_cast(*cast, w, c10::DeviceType::CUDA);
    if (bias.has_value() && bias->defined()) bc = at::autocast::cached_cast(*cast, *bias, c10::DeviceType::CUDA);
  }
  Tensor y = Conv::apply(xc, wc, layer);
  if (bc.has_value() && bc->defined()) y.add_(bc->view({1, -1, 1, 1}));
  return y;
}

// ---- registration from Python --------------------------------------------------------------------------------
int64_t init(const std::string& library) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  if (cudnn.ready) return 1;
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK(lib != nullptr, "ucudnn: cannot open ", library, ": ", dlerror());
  resolve(lib, "cudnnCreate", cudnn.create);
  resolve(lib, "cudnnSetStream", cudnn.set_stream);
  resolve(lib, "cudnnConvolutionForward", cudnn.legacy[FORWARD]);
  resolve(lib, "cudnnConvolutionBackwardData", cudnn.legacy[BACKWARD_DATA]);
  resolve(lib, "cudnnConvolutionBackwardFilter", cudnn.legacy[BACKWARD_FILTER]);
  resolve(lib, "cudnnBackendCreateDescriptor", cudnn.be_create);
  resolve(lib, "cudnnBackendDestroyDescriptor", cudnn.be_destroy);
  resolve(lib, "cudnnBackendSetAttribute", cudnn.be_set);
  resolve(lib, "cudnnBackendGetAttribute", cudnn.be_get);
  resolve(lib, "cudnnBackendFinalize", cudnn.be_finalize);
  resolve(lib, "cudnnBackendExecute", cudnn.be_execute);
  resolve(lib, "cudnnTransformTensor", cudnn.transform);
  resolve(lib, "cudnnGetErrorString", cudnn.error_string);
  cudnn.ready = true;
  return 1;
}

int64_t add_launch(std::unique_ptr<Launch> l) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  launches.push_back(std::move(l));
  return static_cast<int64_t>(launches.size()) - 1;
}

int64_t legacy_launch(int64_t op, int64_t a, int64_t b, int64_t out, int64_t conv, int64_t algo,
                      int64_t workspace) {
  TORCH_CHECK(cudnn.ready, "ucudnn: launch path not initialised");
  TORCH_CHECK(op >= 0 && op <= 2, "ucudnn: op must be 0, 1 or 2, got ", op);
  auto l = std::make_unique<Launch>();
  l->op = op;
  l->a = reinterpret_cast<Desc>(a);
  l->b = reinterpret_cast<Desc>(b);
  l->out = reinterpret_cast<Desc>(out);
  l->conv = reinterpret_cast<Desc>(conv);
  l->algo = static_cast<int>(algo);
  l->workspace = workspace;
  return add_launch(std::move(l));
}

// ucudnn's own kernels as one launch: per call its CUDA functions (``fns``: scalar, vector or 0), the operands its
// vector function needs 16-byte aligned (``aligned``: bits 1 a, 2 b, 4 out), grid, block and shared memory
// (``dims``, 7 a call) and its arguments (``nargs`` a call; ``kinds``: ArgKind, with ``ints`` / ``floats`` holding
// the values of the fixed ones; ARG_WS: the step's workspace), flattened.
int64_t kernel_launch(int64_t op, int64_t workspace, c10::IntArrayRef fns, c10::IntArrayRef aligned,
                      c10::IntArrayRef dims, c10::IntArrayRef nargs, c10::IntArrayRef kinds, c10::IntArrayRef ints,
                      c10::ArrayRef<double> floats) {
  TORCH_CHECK(op >= 0 && op <= 2, "ucudnn: op must be 0, 1 or 2, got ", op);
  const size_t n = nargs.size();
  TORCH_CHECK(n > 0 && fns.size() == 2 * n && aligned.size() == n && dims.size() == 7 * n,
              "ucudnn: a kernel launch needs 2 functions, an alignment mask and 7 dimensions per call");
  size_t total = 0;
  for (int64_t k : nargs) {
    TORCH_CHECK(k >= 0 && k <= 32, "ucudnn: a kernel call takes at most 32 arguments, got ", k);
    total += static_cast<size_t>(k);
  }
  TORCH_CHECK(kinds.size() == total && ints.size() == total && floats.size() == total,
              "ucudnn: one kind, int and float per kernel argument");
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    if (launch_kernel == nullptr) {
      void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
      TORCH_CHECK(lib != nullptr, "ucudnn: cannot open libcuda.so.1: ", dlerror());
      launch_kernel = reinterpret_cast<LaunchKernelFn>(dlsym(lib, "cuLaunchKernel"));
      TORCH_CHECK(launch_kernel != nullptr, "ucudnn: cuLaunchKernel not found in libcuda.so.1");
    }
  }
  auto l = std::make_unique<Launch>();
  l->op = op;
  l->workspace = workspace;
  size_t at = 0;
  for (size_t c = 0; c < n; ++c) {
    Launch::Call call;
    call.scalar = reinterpret_cast<void*>(fns[2 * c]);
    call.vector = reinterpret_cast<void*>(fns[2 * c + 1]);
    TORCH_CHECK(call.scalar != nullptr, "ucudnn: kernel call ", c, " has no function");
    call.aligned = static_cast<int>(aligned[c]);
    for (int d = 0; d < 7; ++d) call.dims[d] = static_cast<unsigned>(dims[7 * c + d]);
    for (int64_t k = 0; k < nargs[c]; ++k, ++at) {
      TORCH_CHECK(kinds[at] >= ARG_A && kinds[at] <= ARG_WS, "ucudnn: unknown kernel argument kind ", kinds[at]);
      call.kinds.push_back(static_cast<int8_t>(kinds[at]));
      call.ints.push_back(ints[at]);
      call.floats.push_back(static_cast<float>(floats[at]));
    }
    l->calls.push_back(std::move(call));
  }
  return add_launch(std::move(l));
}

// Descriptors made while building a plan, destroyed on every exit (the plan keeps what it needs).
struct Built {
  std::vector<Desc> descs;
  ~Built() {
    for (auto it = descs.rbegin(); it != descs.rend(); ++it) cudnn.be_destroy(*it);
  }
  Desc make(int type) {
    Desc d = nullptr;
    Status s = cudnn.be_create(type, &d);
    TORCH_CHECK(s == 0, "ucudnn: cudnnBackendCreateDescriptor(", type, "): ", status_text(s));
    descs.push_back(d);
    return d;
  }
};

void set(Desc d, int name, int type, int64_t count, const void* values) {
  Status s = cudnn.be_set(d, name, type, count, values);
  TORCH_CHECK(s == 0, "ucudnn: cudnnBackendSetAttribute(", name, "): ", status_text(s));
}

void finalize(Desc d, const char* what) {
  Status s = cudnn.be_finalize(d);
  TORCH_CHECK(s == 0, "ucudnn: cudnnBackendFinalize(", what, "): ", status_text(s));
}

Desc tensor(Built& built, int64_t data_type, c10::IntArrayRef dims, c10::IntArrayRef strides, int64_t uid) {
  TORCH_CHECK(dims.size() == 4 && strides.size() == 4, "ucudnn: 4-D tensors only");
  Desc t = built.make(D_TENSOR);
  const int32_t dt = static_cast<int32_t>(data_type);
  const int64_t alignment = 16;
  set(t, A_TENSOR_DATA_TYPE, T_DATA_TYPE, 1, &dt);
  set(t, A_TENSOR_DIMENSIONS, T_INT64, 4, dims.data());
  set(t, A_TENSOR_STRIDES, T_INT64, 4, strides.data());
  set(t, A_TENSOR_UNIQUE_ID, T_INT64, 1, &uid);
  set(t, A_TENSOR_BYTE_ALIGNMENT, T_INT64, 1, &alignment);
  finalize(t, "tensor");
  return t;
}

// The graph source's engine configuration rebuilt from its identity: tensors a, b, out (uids 1, 2, 3, the
// graph source's), one convolution op, the engine by global index, its knobs, the execution plan.  Returns the
// launch id; raises (Python keeps that op on its own path) when cuDNN refuses any step.
int64_t backend_launch(int64_t op, int64_t data_type, c10::IntArrayRef a_dims, c10::IntArrayRef a_strides,
                       c10::IntArrayRef b_dims, c10::IntArrayRef b_strides, c10::IntArrayRef o_dims,
                       c10::IntArrayRef o_strides, c10::IntArrayRef pad, c10::IntArrayRef stride,
                       c10::IntArrayRef dilation, int64_t engine, c10::IntArrayRef knob_types,
                       c10::IntArrayRef knob_values, int64_t workspace, int64_t device, int64_t blend,
                       int64_t scratch_at, int64_t out_bytes) {
  TORCH_CHECK(cudnn.ready, "ucudnn: launch path not initialised");
  TORCH_CHECK(op >= 0 && op <= 2, "ucudnn: op must be 0, 1 or 2, got ", op);
  TORCH_CHECK(knob_types.size() == knob_values.size(), "ucudnn: knob types and values differ in length");
  TORCH_CHECK(pad.size() == 2 && stride.size() == 2 && dilation.size() == 2, "ucudnn: 2-D convolutions only");
  TORCH_CHECK(blend == 0 || (scratch_at >= 0 && out_bytes > 0 && scratch_at % 16 == 0),
              "ucudnn: a blend needs a 16-byte aligned scratch offset and the output's bytes");
  c10::DeviceGuard guard(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device)));
  Handle h = handle_for(static_cast<c10::DeviceIndex>(device), current_stream(static_cast<c10::DeviceIndex>(device)));
  Built built;
  Desc a = tensor(built, data_type, a_dims, a_strides, 1);
  Desc b = tensor(built, data_type, b_dims, b_strides, 2);
  Desc o = tensor(built, data_type, o_dims, o_strides, 3);

  Desc conv = built.make(D_CONVOLUTION);
  const int32_t comp = DATA_FLOAT;
  const int32_t mode = CROSS_CORRELATION;
  const int64_t dims = 2;
  set(conv, A_CONV_COMP_TYPE, T_DATA_TYPE, 1, &comp);
  set(conv, A_CONV_MODE, T_CONVOLUTION_MODE, 1, &mode);
  set(conv, A_CONV_SPATIAL_DIMS, T_INT64, 1, &dims);
  set(conv, A_CONV_DILATIONS, T_INT64, 2, dilation.data());
  set(conv, A_CONV_FILTER_STRIDES, T_INT64, 2, stride.data());
  set(conv, A_CONV_PRE_PADDINGS, T_INT64, 2, pad.data());
  set(conv, A_CONV_POST_PADDINGS, T_INT64, 2, pad.data());
  finalize(conv, "convolution");

  // operand roles: forward (x, w -> y), backward data (w, dy -> dx), backward filter (x, dy -> dw)
  static const int types[3] = {D_OP_CONV_FORWARD, D_OP_CONV_BACKWARD_DATA, D_OP_CONV_BACKWARD_FILTER};
  static const int names[3][6] = {
      {A_FWD_X, A_FWD_W, A_FWD_Y, A_FWD_CONV, A_FWD_ALPHA, A_FWD_BETA},
      {A_BWD_DATA_W, A_BWD_DATA_DY, A_BWD_DATA_DX, A_BWD_DATA_CONV, A_BWD_DATA_ALPHA, A_BWD_DATA_BETA},
      {A_BWD_FILTER_X, A_BWD_FILTER_DY, A_BWD_FILTER_DW, A_BWD_FILTER_CONV, A_BWD_FILTER_ALPHA, A_BWD_FILTER_BETA}};
  const int* n = names[op];
  Desc operation = built.make(types[op]);
  const float alpha = 1.0f, beta = 0.0f;
  set(operation, n[0], T_BACKEND_DESCRIPTOR, 1, &a);
  set(operation, n[1], T_BACKEND_DESCRIPTOR, 1, &b);
  set(operation, n[2], T_BACKEND_DESCRIPTOR, 1, &o);
  set(operation, n[3], T_BACKEND_DESCRIPTOR, 1, &conv);
  set(operation, n[4], T_FLOAT, 1, &alpha);
  set(operation, n[5], T_FLOAT, 1, &beta);
  finalize(operation, "operation");

  Desc graph = built.make(D_OPERATIONGRAPH);
  set(graph, A_OPGRAPH_HANDLE, T_HANDLE, 1, &h);
  set(graph, A_OPGRAPH_OPS, T_BACKEND_DESCRIPTOR, 1, &operation);
  finalize(graph, "operation graph");

  Desc eng = built.make(D_ENGINE);
  set(eng, A_ENGINE_OPERATION_GRAPH, T_BACKEND_DESCRIPTOR, 1, &graph);
  set(eng, A_ENGINE_GLOBAL_INDEX, T_INT64, 1, &engine);
  finalize(eng, "engine");

  std::vector<Desc> choices;
  for (size_t i = 0; i < knob_types.size(); ++i) {
    Desc c = built.make(D_KNOB_CHOICE);
    const int32_t kt = static_cast<int32_t>(knob_types[i]);
    set(c, A_KNOB_CHOICE_TYPE, T_KNOB_TYPE, 1, &kt);
    set(c, A_KNOB_CHOICE_VALUE, T_INT64, 1, &knob_values[i]);
    finalize(c, "knob choice");
    choices.push_back(c);
  }
  Desc cfg = built.make(D_ENGINECFG);
  set(cfg, A_ENGINECFG_ENGINE, T_BACKEND_DESCRIPTOR, 1, &eng);
  if (!choices.empty()) {
    set(cfg, A_ENGINECFG_KNOB_CHOICES, T_BACKEND_DESCRIPTOR, static_cast<int64_t>(choices.size()), choices.data());
  }
  finalize(cfg, "engine config");

  Desc plan = nullptr;
  Status s = cudnn.be_create(D_EXECUTION_PLAN, &plan);
  TORCH_CHECK(s == 0, "ucudnn: cudnnBackendCreateDescriptor(plan): ", status_text(s));
  try {
    set(plan, A_PLAN_HANDLE, T_HANDLE, 1, &h);
    set(plan, A_PLAN_ENGINE_CONFIG, T_BACKEND_DESCRIPTOR, 1, &cfg);
    finalize(plan, "execution plan");
  } catch (...) {
    cudnn.be_destroy(plan);
    throw;
  }
  int64_t need = 0, count = 0;
  s = cudnn.be_get(plan, A_PLAN_WORKSPACE_SIZE, T_INT64, 1, &count, &need);
  if (s != 0 || need > workspace) {
    cudnn.be_destroy(plan);
    TORCH_CHECK(false, "ucudnn: engine ", engine, " needs ", need, " bytes of workspace, the plan gives ", workspace);
  }
  auto l = std::make_unique<Launch>();
  l->op = op;
  l->backend = true;
  l->plan = plan;
  l->workspace = workspace;
  l->blend = reinterpret_cast<Desc>(blend);
  l->scratch_at = scratch_at;
  l->out_bytes = out_bytes;
  return add_launch(std::move(l));
}

// The steps of one op's plan, in order (launch ids, three byte shifts per step, accumulate flags, where each
// step's workspace starts in the output or -1) and the workspace a call takes for the steps that use its buffer.
int64_t add_program(c10::IntArrayRef launch_ids, c10::IntArrayRef shifts, c10::IntArrayRef accumulate,
                    int64_t workspace, c10::IntArrayRef from_out) {
  const size_t n = launch_ids.size();
  TORCH_CHECK(n > 0 && shifts.size() == 3 * n && accumulate.size() == n && from_out.size() == n,
              "ucudnn: a program needs its steps' launches, 3 shifts, an accumulate flag and a workspace origin "
              "per step");
  auto P = std::make_unique<Program>();
  P->workspace = workspace;
  std::lock_guard<std::mutex> lock(registry_mutex);
  int64_t op = -1;
  for (size_t i = 0; i < n; ++i) {
    const int64_t id = launch_ids[i];
    TORCH_CHECK(id >= 0 && id < static_cast<int64_t>(launches.size()), "ucudnn: unknown launch ", id);
    const Launch* l = launches[id].get();
    TORCH_CHECK(op < 0 || l->op == op, "ucudnn: the steps of one program run one op");
    op = l->op;
    TORCH_CHECK(!(accumulate[i] && l->backend && l->blend == nullptr),
                "ucudnn: a backend plan accumulates only through a blend (built with beta 0)");
    const Step step{l, {shifts[3 * i], shifts[3 * i + 1], shifts[3 * i + 2]}, accumulate[i] != 0, from_out[i]};
    TORCH_CHECK(from_out[i] >= 0 || step.need() <= workspace, "ucudnn: step ", i, " needs ", step.need(),
                " bytes of workspace, the program gives ", workspace);
    P->steps.push_back(step);
    P->aligned = P->aligned || l->backend;
  }
  programs.push_back(std::move(P));
  return static_cast<int64_t>(programs.size()) - 1;
}

// One program id per op (-1: Python's), and optionally a fourth: a backward filter's plan that borrows the layer's
// dx (Layer::dw_in_dx).
int64_t add_layer(c10::IntArrayRef program_ids, c10::IntArrayRef y_shape, bool channels_last, int64_t py_layer) {
  TORCH_CHECK(program_ids.size() == 3 || program_ids.size() == 4,
              "ucudnn: one program id per op (-1: Python's), and optionally a backward filter's in dx");
  auto L = std::make_unique<Layer>();
  std::lock_guard<std::mutex> lock(registry_mutex);
  for (size_t i = 0; i < program_ids.size(); ++i) {
    const int64_t id = program_ids[i];
    const int64_t op = i < 3 ? static_cast<int64_t>(i) : BACKWARD_FILTER;
    TORCH_CHECK(id >= -1 && id < static_cast<int64_t>(programs.size()), "ucudnn: unknown program ", id);
    TORCH_CHECK(id < 0 || programs[id]->steps.front().launch->op == op, "ucudnn: program ", id, " is not op ", op);
    Program* P = id < 0 ? nullptr : programs[id].get();
    if (i < 3) {
      L->program[i] = P;
    } else {
      L->dw_in_dx = P;
    }
  }
  L->y_shape = y_shape.vec();
  L->format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  L->py_layer = py_layer;
  layers.push_back(std::move(L));
  return static_cast<int64_t>(layers.size()) - 1;
}

}  // namespace

TORCH_LIBRARY(ucudnn_c, m) {
  // registration (no tensors: catch-all kernels)
  m.def("init(str library) -> int", TORCH_FN(init));
  m.def("legacy_launch(int op, int a, int b, int out, int conv, int algo, int workspace) -> int",
        TORCH_FN(legacy_launch));
  m.def("backend_launch(int op, int data_type, int[] a_dims, int[] a_strides, int[] b_dims, int[] b_strides, "
        "int[] o_dims, int[] o_strides, int[] pad, int[] stride, int[] dilation, int engine, int[] knob_types, "
        "int[] knob_values, int workspace, int device, int blend=0, int scratch_at=0, int out_bytes=0) -> int",
        TORCH_FN(backend_launch));
  m.def("kernel_launch(int op, int workspace, int[] fns, int[] aligned, int[] dims, int[] nargs, int[] kinds, "
        "int[] ints, float[] floats) -> int",
        TORCH_FN(kernel_launch));
  m.def("add_program(int[] launches, int[] shifts, int[] accumulate, int workspace, int[] from_out) -> int",
        TORCH_FN(add_program));
  m.def("add_layer(int[] programs, int[] y_shape, bool channels_last, int py_layer) -> int", TORCH_FN(add_layer));
  m.def("stats() -> int[]", TORCH_FN(stats));
  // implemented in Python (ucudnn.torch.fastpath): the Python path for one op of one layer, into ``out``
  m.def("py_launch(int op, Tensor a, Tensor b, Tensor out, int py_layer) -> ()");
  // the layer's call: autocast's casts, the autograd node, the launches (composite: autograd sees its parts)
  m.def("conv2d(Tensor x, Tensor weight, Tensor? bias, int layer, ScalarType? cast) -> Tensor", TORCH_FN(conv2d));
}
