"""Low-level operations that every layer of robustjax may use: the convolution with its
CPU-friendly backward (``ops.conv``), Gaussian blur (``ops.blur``) and the JPEG round trip
(``ops.jpeg``). They import nothing of robustjax above the checks and sharding helpers."""
