package safetensors

// NumElements returns the product of the dimensions (1 for a scalar). For
// tensors from Parse or Write it does not overflow and Size equals
// NumElements times DType.ElemSize.
func (t Tensor) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}
