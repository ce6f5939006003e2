module @jit_f attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4x8xf32>, %arg1: tensor<i32>) -> (tensor<4xf32> {jax.result_info = "result[0]"}, tensor<i32> {jax.result_info = "result[1]"}) {
    %0 = stablehlo.sine %arg0 : tensor<4x8xf32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %1 = stablehlo.compare GT, %arg1, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %2 = stablehlo.convert %1 : (tensor<i1>) -> tensor<i32>
    %3 = "stablehlo.case"(%2) ({
      %6 = stablehlo.add %0, %arg0 : tensor<4x8xf32>
      stablehlo.return %6 : tensor<4x8xf32>
    }, {
      %cst_1 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
      %6 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<4x8xf32>
      %7 = stablehlo.multiply %0, %6 : tensor<4x8xf32>
      stablehlo.return %7 : tensor<4x8xf32>
    }) : (tensor<i32>) -> tensor<4x8xf32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %4:2 = stablehlo.while(%iterArg = %c_0, %iterArg_1 = %3) : tensor<i32>, tensor<4x8xf32>
    cond {
      %c_2 = stablehlo.constant dense<3> : tensor<i32>
      %6 = stablehlo.compare LT, %iterArg, %c_2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %6 : tensor<i1>
    } do {
      %c_2 = stablehlo.constant dense<1> : tensor<i32>
      %6 = stablehlo.add %iterArg, %c_2 : tensor<i32>
      %cst_3 = stablehlo.constant dense<1.010000e+00> : tensor<f32>
      %7 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<4x8xf32>
      %8 = stablehlo.multiply %iterArg_1, %7 : tensor<4x8xf32>
      stablehlo.return %6, %8 : tensor<i32>, tensor<4x8xf32>
    }
    %cst = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %5 = stablehlo.reduce(%4#1 init: %cst) applies stablehlo.maximum across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
    return %5, %4#0 : tensor<4xf32>, tensor<i32>
  }
}
