# Self-hosting (or a dedicated-GPU Docker Space): the demo on port 7860 as a non-root user.
# ZeroGPU Spaces use the Gradio SDK instead (README front matter); this file is not used there.
FROM python:3.12-slim

# A C++ compiler: the engine compiles its narrow CPU passes (mulo/compiled.py; eager without one).
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*
RUN useradd -m -u 1000 user
USER user
ENV HOME=/home/user PATH=/home/user/.local/bin:$PATH \
    GRADIO_SERVER_NAME=0.0.0.0 GRADIO_SERVER_PORT=7860 GRADIO_ANALYTICS_ENABLED=False
WORKDIR $HOME/app

COPY --chown=user requirements.txt .
# CPU torch wheel from the PyTorch index keeps the image small; drop the index URL for a CUDA build.
RUN pip install --no-cache-dir --user --upgrade pip && \
    pip install --no-cache-dir --user torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && \
    pip install --no-cache-dir --user -r requirements.txt

COPY --chown=user . .
RUN pip install --no-cache-dir --user --no-deps -e .
# The default family's compiled passes, built into the image (~20 s a package, each said as it
# starts): the first visitor meets compiled passes, not a compiler (docs/hosting.md)
RUN python -m mulo compile

EXPOSE 7860
CMD ["python", "app.py"]
