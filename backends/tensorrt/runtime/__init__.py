"""Runtime: engine modules and the stitched graph of engines and PyTorch parts."""
