# The tfps image: one image for every task (ps, worker, chief) of a training job.
#
#   DOCKER_BUILDKIT=1 docker build \
#       --secret id=pip_cert,src=/etc/ssl/certs/ca-certificates.crt -t tfps .
#
# The pip_cert secret is optional: it hands pip a CA bundle for reaching PyPI through a
# TLS-intercepting proxy, without leaving it in any layer.
# GPU image: --build-arg TF_PACKAGE="tensorflow[and-cuda]==2.21.0"
#
# Your own model code, without rebuilding the TensorFlow layers: /opt/usermodels is on
# PYTHONPATH, so either mount it (docker run -v "$PWD/mymodels:/opt/usermodels:ro" ...)
# or derive a thin image:
#   FROM tfps
#   COPY mymodels /opt/usermodels
#
# No "# syntax=" line on purpose: BuildKit's built-in frontend supports the secret and
# bind mounts used here, and an external frontend image would have to be pulled.

ARG TF_PACKAGE=tensorflow-cpu==2.21.0
# tf_keras (Keras 2) for users' Keras models. Installed with --no-deps: it requires the package
# "tensorflow", which tensorflow-cpu is under another name.
ARG TF_KERAS_PACKAGE=tf_keras==2.21.*
# TensorBoard (the tfps_tensorboard / compose tensorboard service), pinned with TensorFlow in
# its layer rather than left to TensorFlow's own requirement: the same pin as
# pyproject.toml's dependencies (a unit test keeps the two equal).
ARG TENSORBOARD_PACKAGE="tensorboard>=2.21,<3"

# ---- build tools: python3 + an empty venv at the final location -----------------------
FROM debian:bookworm-slim AS venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/tfps

# ---- dependencies: TensorFlow in its own layer, then the project's other requirements --
FROM venv AS deps
ARG TF_PACKAGE
ARG TF_KERAS_PACKAGE
ARG TENSORBOARD_PACKAGE
RUN --mount=type=secret,id=pip_cert,required=false \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
 && /opt/tfps/bin/pip install "$TF_PACKAGE" "$TENSORBOARD_PACKAGE" \
 && /opt/tfps/bin/pip install --no-deps "$TF_KERAS_PACKAGE"
# Only [project].dependencies: TensorFlow is an extra (cpu/gpu), chosen by TF_PACKAGE above.
COPY pyproject.toml /src/
RUN --mount=type=secret,id=pip_cert,required=false \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
 && python3 -c 'import tomllib; print("\n".join(tomllib.load(open("/src/pyproject.toml", "rb"))["project"]["dependencies"]))' >/tmp/requirements.txt \
 && /opt/tfps/bin/pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt
# What a task never needs at run time (docs/benchmarks.md, "Image size"):
# * C/C++ headers (tensorflow/include) and libclang (a build-time dependency of
#   TensorFlow's own code generators), the packages' test suites, pip's caches;
# * the symbol tables of TensorFlow's shared libraries (strip --strip-unneeded keeps the
#   dynamic symbols that loading needs: 788 MB -> 583 MB for libtensorflow_cc). Not the
#   libraries auditwheel patched (numpy.libs and the like): stripping breaks those;
# * the byte code of modules a task never imports: every __pycache__ is dropped, then
#   the imports of a training task are run once so that exactly their byte code is back
#   (the image runs as a user who cannot write /opt/tfps, so a missing .pyc would be
#   compiled again at every start).
RUN apt-get update \
 && apt-get install -y --no-install-recommends binutils \
 && site=$(echo /opt/tfps/lib/python3*/site-packages) \
 && rm -rf "$site"/tensorflow/include "$site"/clang "$site"/libclang-* /root/.cache \
 && find /opt/tfps -depth -type d \( -name tests -o -name __pycache__ \) -exec rm -rf {} + \
 && find "$site"/tensorflow -name '*.so*' -type f -exec strip --strip-unneeded {} + \
 && TF_CPP_MIN_LOG_LEVEL=3 /opt/tfps/bin/python -c 'import tensorflow as tf, tf_keras, numpy, yaml, apprise, matplotlib.pyplot; v1 = tf.compat.v1; v1.disable_eager_execution(); v1.train.MonitoredSession, v1.saved_model.Builder, tf.data.Dataset, tf.distribute.Server' \
 && rm -rf /var/lib/apt/lists/*

# ---- the project itself, as a wheel (a code change rebuilds only this and one tiny layer) -
FROM venv AS wheel
COPY pyproject.toml README* /src/
COPY tfps /src/tfps
RUN --mount=type=secret,id=pip_cert,required=false \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
 && /opt/tfps/bin/pip wheel --no-deps --wheel-dir /wheels /src

# ---- runtime ------------------------------------------------------------------------------
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 tini ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --create-home --home-dir /home/tfps --shell /bin/bash tfps \
 && mkdir -p /data /opt/usermodels \
 && chown tfps:tfps /data
COPY --from=deps /opt/tfps /opt/tfps
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    /opt/tfps/bin/pip install --no-cache-dir --no-deps --no-index \
        --disable-pip-version-check --root-user-action=ignore /wheels/*.whl

ENV PATH=/opt/tfps/bin:$PATH \
    PYTHONPATH=/opt/usermodels \
    PYTHONUNBUFFERED=1
# Checkpoints, exports and results.
VOLUME /data
WORKDIR /home/tfps
USER 10001:10001
STOPSIGNAL SIGTERM
# `tfps healthcheck` succeeds when this task's own gRPC port accepts TCP connections.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 CMD ["tfps", "healthcheck"]
# tini as PID 1 forwards signals to tfps and reaps zombies.
ENTRYPOINT ["/usr/bin/tini", "--", "tfps"]
CMD ["--help"]
