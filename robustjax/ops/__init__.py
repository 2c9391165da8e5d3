"""Low-level operations that every layer of robustjax may use: the convolution with its
CPU-friendly backward (``ops.conv``), Gaussian blur (``ops.blur``), the JPEG round trip
(``ops.jpeg``) and a per-example loop whose batch shrinks as examples finish
(``ops.pending``). They import nothing of robustjax above the checks and sharding helpers."""
