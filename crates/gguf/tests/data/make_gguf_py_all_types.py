"""Writes gguf_py_all_types.bin with gguf-py (pip install gguf==0.19.0), an independent GGUF
writer, for crates/gguf/tests/gguf_py_cross_check.rs. Run from this folder:
    python make_gguf_py_all_types.py
The file is committed; the Rust test builds the same content with GgufWriter, expects the
same bytes, and reads every value back. Keep the two in sync."""

import numpy as np
from gguf import GGUFWriter, GGUFValueType, GGMLQuantizationType

w = GGUFWriter("gguf_py_all_types.bin", arch="testarch", use_temp_file=False)
w.add_custom_alignment(64)
w.add_uint8("t.u8", 200)
w.add_int8("t.i8", -100)
w.add_uint16("t.u16", 60000)
w.add_int16("t.i16", -30000)
w.add_uint32("t.u32", 4000000000)
w.add_int32("t.i32", -2000000000)
w.add_float32("t.f32", 1.5)
w.add_uint64("t.u64", 18000000000000000000)
w.add_int64("t.i64", -9000000000000000000)
w.add_float64("t.f64", -2.25)
w.add_bool("t.bool", True)
w.add_string("t.str", "héllo ☃ \n\t\"")
w.add_array("t.arr_i32", [1, -2, 3])
w.add_array("t.arr_str", ["a", "", "ĠĠ"])
w.add_key_value("t.arr_u8", [0, 1, 255], GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT8)
w.add_key_value("t.arr_f32", [0.5, -1.0], GGUFValueType.ARRAY, sub_type=GGUFValueType.FLOAT32)
w.add_array("t.arr_bool", [True, False])
w.add_array("t.nested", [[1, 2], [3]])
w.add_array("t.nested_str", [["x", "y"], ["z"]])
w.add_array("t.nested3", [[[1.5], [2.5, 3.5]], [[4.5]]])

w.add_tensor("f32.vec", np.array([1.0, -2.0, 3.5], dtype=np.float32))
w.add_tensor("f16.mat", np.arange(6, dtype=np.float16).reshape(2, 3))
# One Q8_0 block (32 elements in 34 bytes) per row, 2 rows: raw bytes 0..67 (raw_shape is
# in bytes).
w.add_tensor("q8.mat", np.arange(68, dtype=np.uint8), raw_shape=(2, 34),
             raw_dtype=GGMLQuantizationType.Q8_0)
w.add_tensor("i32.vec", np.array([7, -8], dtype=np.int32))

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
