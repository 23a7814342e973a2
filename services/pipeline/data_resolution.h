// What a job spec leaves for its data to say. A spec may write 0 for the
// embedding's vocab_size or the head's out_features ("as many as the data
// has"), leave a text file's vocabulary empty, or ask for a CSV file's
// standardization; these are filled in once, where the data is read at
// submit (gpipectl, the controller, gpipectl train), so every worker builds
// the same model from the spec alone and the model file records them.
#ifndef GPIPE_SERVICES_PIPELINE_DATA_RESOLUTION_H_
#define GPIPE_SERVICES_PIPELINE_DATA_RESOLUTION_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gpipe/v1/job.pb.h"

namespace gpipe {

// A field of a spec that only its data can fill, as its path
// ("model.layers[0].embedding.vocab_size"). A required one cannot be
// trained without; the others (a text file's vocabulary) are only recorded,
// and workers derive the same from the data.
struct DataDependentField {
  std::string field;
  bool required = false;
  // What a spec gives instead, where the data cannot be read: the value
  // itself, or another field (a CSV's standardization is data.normalize's
  // mean and std: a boolean has no value to give).
  std::string give = "the value";
};
std::vector<DataDependentField> DataDependentFields(
    const gpipe::v1::JobSpec& spec);

// Opens the data and fills every field DataDependentFields lists: the class
// count (text: the vocabulary size; tokens: the largest id + 1) into 0-sized
// embeddings and heads, the file's bytes into data.text.vocabulary, the
// train split's per-feature mean and standard deviation into
// data.normalize. A spec with nothing to fill is left untouched and no file
// is read. Errors are the data's (naming field and file). `filled`, when
// given, gets which sizes came from which ids, for a later error about such
// a layer to name its cause.
struct FilledSize {
  std::string layer;  // "model.layers[2]"
  std::string note;   // "model.layers[2].linear.out_features 300000001 was
                      // filled from the data: its largest class id is ..."
};
absl::Status ResolveDataDependentFields(
    gpipe::v1::JobSpec* spec, std::vector<FilledSize>* filled = nullptr);

// A job that starts from a model file (init_from) reads its data as that
// model was trained to read it: the file's text vocabulary, table feature
// columns and normalization go into the spec where it gives none of its
// own. Numbered afresh from other data, a text's ids shifted under the
// trained embedding (a first loss of 7.39 for a model at 0.60) and a
// table's reordered columns met the wrong weights, silently; now a byte
// outside the vocabulary, or a table of other columns, is refused when the
// data is read. Done where a job is made (gpipectl's train, local and
// submit, the controller's submit), where the file can be read; a file
// that is no model file (weights alone, a checkpoint) changes nothing.
// A record that is there but cannot be read (RecordedJobSpec) is an error.
absl::Status AdoptInitFromPreprocessing(gpipe::v1::JobSpec* spec);

// Makes the spec's paths (SpecPaths) absolute against `base` (the
// submitter's directory): a worker elsewhere would resolve a relative path
// against its own. Absolute paths stay as they are.
void ResolveDataPaths(const std::string& base, gpipe::v1::JobSpec* spec);

// Every file or directory path of the spec's data and init_from, with the
// field it comes from: {"data.text.path", "/corpus.txt"}.
std::vector<std::pair<std::string, std::string>> SpecPaths(
    const gpipe::v1::JobSpec& spec);

// FAILED_PRECONDITION naming the field and the path for the first of
// SpecPaths that does not exist here.
absl::Status CheckSpecPathsExist(const gpipe::v1::JobSpec& spec);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_DATA_RESOLUTION_H_
