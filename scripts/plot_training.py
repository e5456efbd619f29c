"""Plot a run's training curve: training loss and validation loss/BLEU against the step.

    python scripts/plot_training.py --model-dir runs/multi30k -o docs/multi30k_curve.png

Reads the TensorBoard scalars that train_wmt.py writes to MODEL_DIR/logs.
"""

import argparse
import glob
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def read_scalars(log_dir: str) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} from every event file under `log_dir`, sorted by step."""
    import tensorflow as tf

    files = sorted(glob.glob(os.path.join(log_dir, "**", "events.out.tfevents.*"),
                             recursive=True))
    if not files:
        raise FileNotFoundError(f"No TensorBoard event files under {log_dir}.")
    series: dict[str, dict[int, float]] = {}
    for path in files:
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                number = tf.make_ndarray(value.tensor) if value.HasField("tensor") \
                    else value.simple_value
                series.setdefault(value.tag, {})[event.step] = float(number)
    return {tag: sorted(points.items()) for tag, points in series.items()}


def plot(series: dict, path: str, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, loss_axis = plt.subplots(figsize=(8, 4.5), dpi=110)
    for tag, style in (("loss", "-"), ("val_loss", "o-")):
        if tag in series:
            steps, values = zip(*series[tag], strict=True)
            loss_axis.plot(steps, values, style, label=tag.replace("_", " "), markersize=3)
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("label-smoothed cross-entropy")
    handles, labels = loss_axis.get_legend_handles_labels()
    if "val_bleu" in series:
        bleu_axis = loss_axis.twinx()
        steps, values = zip(*series["val_bleu"], strict=True)
        bleu_axis.plot(steps, values, "s-", color="tab:green", label="validation BLEU",
                       markersize=3)
        bleu_axis.set_ylabel("sacreBLEU (validation)")
        more_handles, more_labels = bleu_axis.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    loss_axis.legend(handles, labels, loc="center right")
    loss_axis.set_title(title)
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", required=True, help="run directory with logs/")
    parser.add_argument("-o", "--output", default="training_curve.png", help="PNG to write")
    parser.add_argument("--title", default="", help="plot title")
    args = parser.parse_args(argv)
    try:
        series = read_scalars(os.path.join(args.model_dir, "logs"))
    except FileNotFoundError as error:
        print(f"plot_training.py: error: {error}", file=sys.stderr)
        return 2
    plot(series, args.output, args.title)
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
