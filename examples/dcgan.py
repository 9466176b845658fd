"""Train a DCGAN in float16 (or bfloat16) with mxfp16: two networks, two mxfp16.Trainers.

The images are scikit-learn's handwritten digits (8x8, 1797 of them, shipped with scikit-learn: no
download).  Generator (transposed convolutions, as in DCGAN) and discriminator are cast with
``mxfp16.cast_block``; each has its own
``mxfp16.Trainer`` with dynamic loss scaling, or, with ``--shared-scaler``, one
``DynamicLossScaler`` serves both, as PyTorch's GradScaler serves several optimizers.

    python examples/dcgan.py --dtype float16
    python examples/dcgan.py --dtype float16 --shared-scaler --num-epochs 30

It ends with one line: ``dcgan: dtype=float16 ... nn_dist_start=... nn_dist=...``, where nn_dist is
the mean distance from a generated digit to its nearest real one (it falls as the generator learns).
"""
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn
from sklearn.datasets import load_digits

import mxfp16
from common import check_positive, devices, make_parser, run


def generator(ngf, latent_size):
    """Latent (N, nz) -> 4x4 -> 8x8 images in [-1, 1], by transposed convolutions (DCGAN).

    They train on a CPU in float16 and bfloat16 with oneDNN on: mxfp16 runs each cast
    ``Conv2DTranspose`` as the equivalent ``Convolution`` (see docs/sequence_models.md, transposed
    convolutions); ``in_channels`` makes the weights' shapes known when the network is cast, which
    the faster of its two forms needs.  The image comes out of a 3x3 ``Conv2D``: MXNet 1.9.1's oneDNN
    ``Deconvolution`` with one output channel and 16 or more input channels fails in float32 too
    ("could not create a primitive descriptor for a reorder primitive").
    """
    net = nn.HybridSequential(prefix="gen_")
    with net.name_scope():
        net.add(nn.HybridLambda(lambda F, x: F.reshape(x, (0, -1, 1, 1))),
                nn.Conv2DTranspose(ngf * 2, 4, 1, 0, use_bias=False, in_channels=latent_size),
                nn.BatchNorm(), nn.Activation("relu"),
                nn.Conv2DTranspose(ngf, 4, 2, 1, use_bias=False, in_channels=ngf * 2),
                nn.BatchNorm(),
                nn.Activation("relu"),
                nn.Conv2D(1, 3, 1, 1), nn.Activation("tanh"))
    return net


def discriminator(ndf):
    """8x8 images -> one logit per image (real or fake)."""
    net = nn.HybridSequential(prefix="disc_")
    with net.name_scope():
        net.add(nn.Conv2D(ndf, 4, 2, 1, use_bias=False), nn.LeakyReLU(0.2),
                nn.Conv2D(ndf * 2, 4, 2, 1, use_bias=False), nn.BatchNorm(), nn.LeakyReLU(0.2),
                nn.Conv2D(1, 2, 1, 0, use_bias=False), nn.Flatten())
    return net


def get_args_parser():
    parser = make_parser(__doc__.split("\n\n")[0], epochs=15, batch_size=64, lr=0.0002)
    add = parser.add_argument
    add("--latent-size", type=int, default=32, help="size of the generator's input (default: 32)")
    add("--ngf", type=int, default=64, help="generator width (default: 64)")
    add("--ndf", type=int, default=64, help="discriminator width (default: 64)")
    add("--shared-scaler", action="store_true",
        help="one dynamic loss scaler for both Trainers, in float16 (default: one each)")
    return parser


def load_images():
    """The digits as float32 (N, 1, 8, 8) in [-1, 1]."""
    images = load_digits().images.astype(np.float32)
    return (images / 8.0 - 1.0).reshape(-1, 1, 8, 8)


def nearest_real_distance(fakes, reals):
    """Mean L2 distance from each generated image to its nearest real image."""
    fakes, reals = fakes.reshape(len(fakes), -1), reals.reshape(len(reals), -1)
    squared = (fakes ** 2).sum(1)[:, None] - 2 * fakes @ reals.T + (reals ** 2).sum(1)[None]
    return float(np.sqrt(np.maximum(squared.min(1), 0)).mean())


def sample(gen, count, latent_size, ctx, seed=1234):
    noise = mx.nd.array(np.random.RandomState(seed).normal(size=(count, latent_size)), ctx=ctx)
    return gen(noise).asnumpy()


def train_step(gen, disc, gen_trainer, disc_trainer, loss_fn, reals, latent_size):
    """One discriminator and one generator step over the devices' slices of a batch."""
    batch_size = sum(real.shape[0] for real in reals)
    noises = [mx.nd.random.normal(shape=(real.shape[0], latent_size), ctx=real.context)
              for real in reals]
    with autograd.record():
        fakes = [gen(noise) for noise in noises]
        disc_losses = [loss_fn(disc(real), mx.nd.ones((real.shape[0], 1), ctx=real.context)) +
                       loss_fn(disc(fake.detach()), mx.nd.zeros((real.shape[0], 1), ctx=real.context))
                       for real, fake in zip(reals, fakes)]
    disc_trainer.backward(disc_losses)
    disc_trainer.step(batch_size)
    with autograd.record():
        gen_losses = [loss_fn(disc(fake), mx.nd.ones((fake.shape[0], 1), ctx=fake.context))
                      for fake in fakes]
    gen_trainer.backward(gen_losses)
    gen_trainer.step(batch_size)
    return (np.mean([loss.mean().asscalar() for loss in disc_losses]),
            np.mean([loss.mean().asscalar() for loss in gen_losses]))


def main(argv=None):
    args = get_args_parser().parse_args(argv)
    check_positive(args, "num_epochs", "batch_size", "lr", "latent_size", "ngf", "ndf")
    ctx = devices(args.gpus, args.cpus)
    mx.random.seed(args.seed)
    np.random.seed(args.seed)  # the DataLoader shuffles with numpy
    images = load_images()
    data = gluon.data.DataLoader(gluon.data.ArrayDataset(images), batch_size=args.batch_size,
                                 shuffle=True, last_batch="discard")

    gen, disc = generator(args.ngf, args.latent_size), discriminator(args.ndf)
    for net in (gen, disc):
        net.initialize(mx.init.Normal(0.02), ctx=ctx)
        net.hybridize()
    gen = mxfp16.cast_block(gen, args.dtype)
    disc = mxfp16.cast_block(disc, args.dtype)
    # None: each Trainer makes its own (dynamic for float16); a scaler object: both share it
    scaler = mxfp16.DynamicLossScaler() if args.shared_scaler and args.dtype == "float16" else None
    adam = {"learning_rate": args.lr, "beta1": 0.5}
    gen_trainer = mxfp16.Trainer(gen.collect_params(), "adam", adam, dtype=args.dtype,
                                 loss_scale=scaler)
    disc_trainer = mxfp16.Trainer(disc.collect_params(), "adam", adam, dtype=args.dtype,
                                  loss_scale=scaler)
    loss_fn = gluon.loss.SigmoidBinaryCrossEntropyLoss()

    start_dist = nearest_real_distance(sample(gen, 256, args.latent_size, ctx[0]), images)
    start = time.time()
    for epoch in range(args.num_epochs):
        for batch in data:
            reals = gluon.utils.split_and_load(batch, ctx)
            disc_loss, gen_loss = train_step(gen, disc, gen_trainer, disc_trainer, loss_fn, reals,
                                             args.latent_size)
        dist = nearest_real_distance(sample(gen, 256, args.latent_size, ctx[0]), images)
        print(f"epoch {epoch}: D loss {disc_loss:.3f}, G loss {gen_loss:.3f}, nn_dist {dist:.3f}, "
              f"loss scales G {gen_trainer.loss_scale:g} D {disc_trainer.loss_scale:g}")
    # a shared scaler counts the skipped steps of both Trainers
    skipped = scaler.num_skipped if scaler else gen_trainer.num_skipped + disc_trainer.num_skipped
    print(f"dcgan: dtype={args.dtype} epochs={args.num_epochs} d_loss={disc_loss:.3f} "
          f"g_loss={gen_loss:.3f} nn_dist_start={start_dist:.3f} nn_dist={dist:.3f} "
          f"g_scale={gen_trainer.loss_scale:g} d_scale={disc_trainer.loss_scale:g} "
          f"skipped={skipped} "
          f"time={time.time() - start:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
