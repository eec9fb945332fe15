package transfer

import "github.com/pinmem/pinmem/cuda"

// allDevices returns every CUDA device.
func allDevices() ([]*cuda.Device, error) {
	n, err := cuda.DeviceCount()
	if err != nil {
		return nil, err
	}
	devs := make([]*cuda.Device, 0, n)
	for i := range n {
		d, err := cuda.GetDevice(i)
		if err != nil {
			return nil, err
		}
		devs = append(devs, d)
	}
	return devs, nil
}
