// Loads a SavedModel the way TF Serving does and replays PredictionLog requests through it.
//
// serve_saved_model [--xla_cpu_compilation_enabled=true] OP_LIBRARIES EXPORT_DIR
//                   OUTPUT_TFRECORD REQUESTS_TFRECORD...
//
// As tensorflow_model_server, XLA:CPU compilation is disabled (tensorflow::
// DisableXlaCompilation) unless --xla_cpu_compilation_enabled=true comes first: a program
// compiled by XLA (an export's compiled search) then fails with "XLA compilation disabled".
// OP_LIBRARIES (tensorflow-text's op libraries an export uses, ':'-separated: its
// SentencePiece and regex-split ops, which TF Serving links in) are loaded with TF_LoadLibrary,
// EXPORT_DIR with tensorflow::LoadSavedModel(..., {"serve"}). Each record of each
// REQUESTS_TFRECORD is a tensorflow.serving.PredictionLog holding a predict_log; its request
// runs through the SignatureDef it names (Session::Run with the signature's tensor names),
// as TF Serving's warm-up does at load. OUTPUT_TFRECORD gets, per request and per output key
// in sorted order, a record "<signature>/<key>" then the output's serialized TensorProto.
// Stdout: "rss_mib STAGE MiB" lines (resident memory with the runtime and op library
// loaded, with the SavedModel loaded, after each REQUESTS_TFRECORD), a "run_ms INDEX MS" line
// per request (the wall time of its Session::Run, steady clock; INDEX counts from 0 over all
// files), "peak_rss_mib MiB" (VmHWM: this program's own peak, which a parent's wait4
// ru_maxrss can hide: it counts the parent's resident memory at the fork), then
// "ran N requests".
// The PredictionLog is read field by field with protobuf's CodedInputStream, since the
// wheel has no generated C++ classes for the tensorflow_serving protos.
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "google/protobuf/io/coded_stream.h"
#include "tensorflow/c/c_api.h"
#include "tensorflow/cc/saved_model/loader.h"
#include "tensorflow/compiler/jit/flags.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/lib/io/record_reader.h"
#include "tensorflow/core/lib/io/record_writer.h"
#include "tensorflow/core/platform/env.h"

namespace {

using google::protobuf::io::CodedInputStream;

// The length-delimited fields of a serialized message: (field number, bytes), in order.
bool Fields(const std::string& bytes, std::vector<std::pair<int, std::string>>* fields) {
  CodedInputStream input(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  while (uint32_t tag = input.ReadTag()) {
    uint64_t skipped;
    uint32_t skipped32;
    switch (tag & 7) {
      case 0: if (!input.ReadVarint64(&skipped)) return false; break;
      case 1: if (!input.ReadLittleEndian64(&skipped)) return false; break;
      case 5: if (!input.ReadLittleEndian32(&skipped32)) return false; break;
      case 2: {
        uint32_t length;
        std::string value;
        if (!input.ReadVarint32(&length) || !input.ReadString(&value, length)) return false;
        fields->emplace_back(static_cast<int>(tag >> 3), std::move(value));
        break;
      }
      default: return false;
    }
  }
  return input.ConsumedEntireMessage();
}

struct Request {
  std::string signature;
  std::map<std::string, tensorflow::Tensor> inputs;
};

// PredictionLog.predict_log (6) -> PredictLog.request (1) -> PredictRequest:
// model_spec (1) -> ModelSpec.signature_name (3); inputs (2): map entries key (1), value (2).
bool ParsePredictionLog(const std::string& record, Request* request) {
  std::vector<std::pair<int, std::string>> log, predict_log, fields;
  if (!Fields(record, &log)) return false;
  for (const auto& [number, bytes] : log) {
    if (number == 6 && !Fields(bytes, &predict_log)) return false;
  }
  for (const auto& [number, bytes] : predict_log) {
    if (number == 1 && !Fields(bytes, &fields)) return false;
  }
  request->signature = "serving_default";  // TF Serving's default for an empty name
  for (const auto& [number, bytes] : fields) {
    std::vector<std::pair<int, std::string>> inner;
    if (!Fields(bytes, &inner)) return false;
    if (number == 1) {
      for (const auto& [n, value] : inner) {
        if (n == 3 && !value.empty()) request->signature = value;
      }
    } else if (number == 2) {
      std::string key;
      tensorflow::TensorProto proto;
      for (const auto& [n, value] : inner) {
        if (n == 1) key = value;
        if (n == 2 && !proto.ParseFromString(value)) return false;
      }
      tensorflow::Tensor tensor;
      if (!tensor.FromProto(proto)) return false;
      request->inputs[key] = tensor;
    }
  }
  return !request->inputs.empty();
}

// "NAME MiB" on stdout: FIELD ("VmRSS:", "VmHWM:") of /proc/self/status, kB, in MiB.
void ReportStatus(const std::string& field, const std::string& name) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) {
      std::cout << name << " " << std::stol(line.substr(field.size())) / 1024.0 << std::endl;
    }
  }
}

// "rss_mib STAGE MiB" on stdout: this process's resident memory (VmRSS) at STAGE.
void ReportResident(const std::string& stage) { ReportStatus("VmRSS:", "rss_mib " + stage); }

int Fail(const std::string& message) {
  std::cerr << "error: " << message << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string xla_flag = "--xla_cpu_compilation_enabled=";
  bool xla_enabled = false;
  if (argc > 1 && std::string(argv[1]).rfind(xla_flag, 0) == 0) {
    std::string value = std::string(argv[1]).substr(xla_flag.size());
    if (value != "true" && value != "false") {
      return Fail(xla_flag + value + ": expected true or false");
    }
    xla_enabled = value == "true";
    ++argv;
    --argc;
  }
  if (argc < 5) {
    return Fail("usage: serve_saved_model [--xla_cpu_compilation_enabled=true] OP_LIBRARIES "
                "EXPORT_DIR OUTPUT REQUESTS...");
  }
  if (!xla_enabled) tensorflow::DisableXlaCompilation();  // tensorflow_model_server's default
  TF_Status* status = TF_NewStatus();
  std::string libraries = argv[1];
  for (size_t start = 0; start <= libraries.size();) {
    size_t end = libraries.find(':', start);
    if (end == std::string::npos) end = libraries.size();
    std::string library = libraries.substr(start, end - start);
    start = end + 1;
    if (library.empty()) continue;
    TF_LoadLibrary(library.c_str(), status);
    if (TF_GetCode(status) != TF_OK) {
      return Fail("TF_LoadLibrary(" + library + "): " + TF_Message(status));
    }
  }
  TF_DeleteStatus(status);
  ReportResident("runtime");

  tensorflow::SavedModelBundle bundle;
  tensorflow::Status loaded = tensorflow::LoadSavedModel(
      tensorflow::SessionOptions(), tensorflow::RunOptions(), argv[2],
      {"serve"}, &bundle);
  if (!loaded.ok()) return Fail("LoadSavedModel: " + loaded.ToString());
  ReportResident("loaded");
  const auto& signatures = bundle.meta_graph_def.signature_def();

  std::unique_ptr<tensorflow::WritableFile> file;
  tensorflow::Env* env = tensorflow::Env::Default();
  if (!env->NewWritableFile(argv[3], &file).ok()) return Fail("cannot write output");
  tensorflow::io::RecordWriter writer(file.get());
  int count = 0;
  for (int i = 4; i < argc; ++i) {
    std::unique_ptr<tensorflow::RandomAccessFile> source;
    if (!env->NewRandomAccessFile(argv[i], &source).ok()) return Fail("cannot read " + std::string(argv[i]));
    tensorflow::io::SequentialRecordReader reader(source.get());
    tensorflow::tstring record;
    while (reader.ReadRecord(&record).ok()) {
      Request request;
      if (!ParsePredictionLog(std::string(record), &request)) {
        return Fail("record " + std::to_string(count) + " is not a PredictLog");
      }
      auto signature = signatures.find(request.signature);
      if (signature == signatures.end()) return Fail("no signature " + request.signature);
      std::vector<std::pair<std::string, tensorflow::Tensor>> feeds;
      for (const auto& [key, tensor] : request.inputs) {
        auto info = signature->second.inputs().find(key);
        if (info == signature->second.inputs().end()) return Fail("no input " + key);
        feeds.emplace_back(info->second.name(), tensor);
      }
      std::map<std::string, std::string> outputs;  // key -> tensor name, sorted by key
      for (const auto& [key, info] : signature->second.outputs()) outputs[key] = info.name();
      std::vector<std::string> names;
      for (const auto& [key, name] : outputs) names.push_back(name);
      std::vector<tensorflow::Tensor> fetched;
      auto start = std::chrono::steady_clock::now();
      tensorflow::Status ran = bundle.session->Run(feeds, names, {}, &fetched);
      std::chrono::duration<double, std::milli> run_ms = std::chrono::steady_clock::now() - start;
      if (!ran.ok()) return Fail("Session::Run(" + request.signature + "): " + ran.ToString());
      std::cout << "run_ms " << count << " " << run_ms.count() << "\n";
      int j = 0;
      for (const auto& [key, name] : outputs) {
        tensorflow::TensorProto proto;
        fetched[j++].AsProtoField(&proto);
        if (!writer.WriteRecord(request.signature + "/" + key).ok() ||
            !writer.WriteRecord(proto.SerializeAsString()).ok()) {
          return Fail("cannot write output");
        }
      }
      ++count;
    }
    ReportResident("after_" + std::to_string(i - 3));
  }
  if (!writer.Close().ok() || !file->Close().ok()) return Fail("cannot close output");
  ReportStatus("VmHWM:", "peak_rss_mib");
  std::cout << "ran " << count << " requests" << std::endl;
  return 0;
}
