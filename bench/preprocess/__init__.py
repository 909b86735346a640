"""Do the page workers (rasterise, resize, encode) outrun an H200 engine? (bench.preprocess)"""
