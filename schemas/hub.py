"""Vocabularies of the Hugging Face Hub's dataset-card metadata (what its card validation accepts)."""

from __future__ import annotations

# https://huggingface.co/docs/hub/repositories-licenses
LICENSES = frozenset("""apache-2.0 mit openrail bigscience-openrail-m creativeml-openrail-m bigscience-bloom-rail-1.0
bigcode-openrail-m afl-3.0 artistic-2.0 bsl-1.0 bsd bsd-2-clause bsd-3-clause bsd-3-clause-clear c-uda cc cc0-1.0
cc-by-2.0 cc-by-2.5 cc-by-3.0 cc-by-4.0 cc-by-sa-3.0 cc-by-sa-4.0 cc-by-nc-2.0 cc-by-nc-3.0 cc-by-nc-4.0 cc-by-nd-4.0
cc-by-nc-nd-3.0 cc-by-nc-nd-4.0 cc-by-nc-sa-2.0 cc-by-nc-sa-3.0 cc-by-nc-sa-4.0 cdla-sharing-1.0 cdla-permissive-1.0
cdla-permissive-2.0 wtfpl ecl-2.0 epl-1.0 epl-2.0 etalab-2.0 eupl-1.1 eupl-1.2 agpl-3.0 gfdl gpl gpl-2.0 gpl-3.0 lgpl
lgpl-2.1 lgpl-3.0 isc h-research intel-research lppl-1.3c ms-pl apple-ascl apple-amlr mpl-2.0 odc-by odbl
openrail++ osl-3.0 postgresql ofl-1.1 ncsa unlicense zlib pddl lgpl-lr deepfloyd-if-license llama2 llama3 llama3.1
llama3.2 llama3.3 llama4 gemma unknown other""".split())

# (upper bound exclusive, category), smallest first; `n>1T` beyond the last
SIZE_BANDS = [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
              (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M"), (10**9, "100M<n<1B"), (10**10, "1B<n<10B"),
              (10**11, "10B<n<100B"), (10**12, "100B<n<1T")]
SIZE_CATEGORIES = frozenset([c for _, c in SIZE_BANDS] + ["n>1T", "unknown", "other"])

# the Hub's task categories (its pipeline types) that a dataset card may declare
TASK_CATEGORIES = frozenset("""text-classification token-classification table-question-answering question-answering
zero-shot-classification translation summarization feature-extraction text-generation fill-mask sentence-similarity
text-to-speech text-to-audio automatic-speech-recognition audio-to-audio audio-classification audio-text-to-text
voice-activity-detection depth-estimation image-classification object-detection image-segmentation text-to-image
image-to-text image-to-image image-to-video unconditional-image-generation video-classification
reinforcement-learning robotics tabular-classification tabular-regression tabular-to-text table-to-text
multiple-choice text-ranking text-retrieval time-series-forecasting text-to-video image-text-to-text
visual-question-answering document-question-answering zero-shot-image-classification graph-ml mask-generation
zero-shot-object-detection text-to-3d image-to-3d image-feature-extraction video-text-to-text keypoint-detection
visual-document-retrieval any-to-any video-to-video other""".split())


def size_category(rows: int) -> str:
    """The Hub's `size_categories` value for a number of rows."""
    for bound, name in SIZE_BANDS:
        if rows < bound:
            return name
    return "n>1T"
